"""The shape of conversation codes and tokens."""

from __future__ import annotations

import re
from typing import Any

from nexus_workflows.phi.exceptions import InvalidCode
from nexus_workflows.phi.normalization import CATEGORIES, is_valid_unicode

CODE_MAX_LENGTH = 255
TOKEN_MAX_LENGTH = 40  # "<<TELEFONO_" + up to 27 digits + ">>"

#: A whole token of any category. Numbers start at 1 and have no leading zero, and the
#: closing ">>" is part of the match, so <<PERSONA_1>> never matches inside <<PERSONA_10>>.
TOKEN_PATTERN = re.compile(r"<<(?:%s)_[1-9][0-9]{0,26}>>" % "|".join(CATEGORIES))  # noqa: UP031


def make_token(category: str, number: int) -> str:
    return f"<<{category}_{number}>>"


def check_code(code: Any) -> str:
    """The conversation code, or :class:`InvalidCode` saying what is allowed."""
    allowed = f"a non-empty string of at most {CODE_MAX_LENGTH} characters"
    if not isinstance(code, str):
        raise InvalidCode(f"the conversation code is {type(code).__name__}; it must be {allowed}")
    if not code.strip():
        raise InvalidCode(f"the conversation code is empty or only whitespace; it must be {allowed}")
    if len(code) > CODE_MAX_LENGTH:
        raise InvalidCode(f"the conversation code has {len(code)} characters; it must be {allowed}")
    if "\x00" in code:
        raise InvalidCode("the conversation code contains a NUL character, which databases cannot store")
    if not code.isascii() and not is_valid_unicode(code):
        raise InvalidCode(
            f"the conversation code is not valid Unicode (it has a lone surrogate); it must be {allowed}"
        )
    return code
