"""Argument types shared by the management commands: bounded, and never echoing what was
given (an argument may be patient data). Django lists no command for a module whose name
starts with an underscore."""

from __future__ import annotations

import argparse
import math
import re
from argparse import ArgumentTypeError
from collections.abc import Callable, Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from nexus_workflows.limits import MAX_DELAY

#: Longest number of seconds an argument takes: ten years, as for the settings.
MAX_SECONDS = MAX_DELAY.total_seconds()


def whole_number(least: int, most: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argument type: an int from ``least`` to ``most``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:  # not a number, or too many digits to read
            number = least - 1
        if not least <= number <= most:
            raise ArgumentTypeError(f"must be {what} of at least {least} and at most {most:,}")
        return number

    return parse


def number(value: str) -> float:
    """An argument type: any float (the command checks its range), read without echoing it."""
    try:
        return float(value)
    except ValueError:
        raise ArgumentTypeError("must be a number") from None


def seconds(value: str) -> float:
    """An argument type: a number of seconds greater than 0 and at most MAX_SECONDS."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= MAX_SECONDS:
        raise ArgumentTypeError(
            f"must be a number of seconds greater than 0 and at most {MAX_SECONDS:,.0f} (ten years)"
        )
    return number


# argparse's messages, matched whole: only these are kept, and only what they name of the
# parser itself (argument names, choices, our own types' messages) is shown again. Any other
# (a value quoted, "ignored explicit argument '…'", a wording of another Python or locale)
# says only which argument it is about, or nothing: it fails closed.
_NAMES = r"[\w/ ,-]+"  # option strings and metavars: the parser's, never what was given
_ABOUT = re.compile(rf"argument (?P<name>{_NAMES}): (?P<rest>.*)", re.S)
_KEPT = re.compile(
    rf"expected (?:one|at most one|at least one|\d+) arguments?|not allowed with argument {_NAMES}"
    # The app's own argument types (this module's, and runworkflows' port): no value in them.
    r"|must be [^'\"]*"
)
_KEPT_WHOLE = re.compile(
    rf"the following arguments are required: {_NAMES}|one of the arguments {_NAMES} is required"
)
# Greedy up to the last "(choose from …)", which argparse appends after the value.
_INVALID_CHOICE = re.compile(r"invalid choice: .* \((?P<choices>choose from [^()]*)\)", re.S)
UNRECOGNIZED = "unrecognized arguments (not shown: they may be patient data)"
NOT_PARSED = "the arguments do not parse (not shown: they may be patient data)"


def without_values(message: str) -> str:
    """An argparse error message that quotes nothing given: one of the parser's own, kept
    whole; one that quoted a value, with the value taken out; or a fixed one."""
    if _KEPT_WHOLE.fullmatch(message):
        return message
    if message.startswith("unrecognized arguments:"):
        return UNRECOGNIZED
    about = _ABOUT.fullmatch(message)
    rest = about["rest"] if about else message
    prefix = f"argument {about['name']}: " if about else ""
    if _KEPT.fullmatch(rest):
        return message
    if choice := _INVALID_CHOICE.fullmatch(rest):
        return f"{prefix}invalid choice ({choice['choices']})"
    if about:
        return f"{prefix}not accepted as given (not shown: it may be patient data)"
    return NOT_PARSED


class ParserNotEchoing(CommandParser):
    """Django's parser, whose errors (on standard error, or in the ``CommandError`` of
    ``call_command``) never quote an argument: it may be a trigger or a key."""

    def error(self, message: str) -> Any:
        return super().error(without_values(message))


class ArgumentsNotEchoed(BaseCommand):
    """A command whose parser, and each of its subcommands', is :class:`ParserNotEchoing`.
    Django builds a plain ``CommandParser`` (``create_parser`` takes no class), so each
    parser it built is narrowed to this subclass, which adds only ``error``."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        for each in _parsers_of(parser):
            each.__class__ = ParserNotEchoing
        return parser


def _parsers_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # argparse lists subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from _parsers_of(subparser)
