"""Job ids of fire-and-forget workflows: ``<kind>__<dedupe key>``, escaped reversibly."""

from __future__ import annotations

import re

# Separates the kind from the dedupe key in a job id; kinds may not contain it.
SEPARATOR = "__"
# Dedupe keys of this form are used in the job id as they are. Others are escaped (see
# job_id_for); the first character is never '_', so a kind ending in '_' cannot make
# two (kind, key) pairs share an id.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_KEPT_WHEN_ESCAPING = re.compile(r"[A-Za-z0-9_]")
_ESCAPE = "-"


# --- job ids ------------------------------------------------------------------------------


def job_id_for(kind: str, dedupe_key: str) -> str:
    """The RQ job id of a fire-and-forget workflow: ``<kind>__<dedupe key>``.

    RQ job ids may only contain letters, digits, '_' and '-'. A key made of those that
    starts with a letter or digit (``"123"``, a UUID) is used as it is. Any other key is
    escaped, deterministically and reversibly: the escaped form starts with '-', letters,
    digits and '_' stay, and every other character becomes '-' plus two lowercase hex
    digits per UTF-8 byte. So ``"visit/7"`` → ``"-visit-2f7"`` and ``"-5"`` → ``"--2d5"``.
    """
    if _PLAIN_KEY.fullmatch(dedupe_key):
        return f"{kind}{SEPARATOR}{dedupe_key}"
    escaped = "".join(
        char
        if _KEPT_WHEN_ESCAPING.fullmatch(char)
        else "".join(f"{_ESCAPE}{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        for char in dedupe_key
    )
    return f"{kind}{SEPARATOR}{_ESCAPE}{escaped}"


def split_job_id(job_id: str) -> tuple[str, str]:
    """The ``(kind, dedupe key)`` a job id was made from; the inverse of :func:`job_id_for`.

    Raises ``ValueError`` for an id that :func:`job_id_for` cannot have made.
    """
    start = job_id.find(SEPARATOR)
    if start < 1:
        raise ValueError("not a fire-and-forget job id: no '__' after the kind")
    # A kind may end in one '_' (it cannot contain '__') and a key part never starts
    # with '_', so the key starts after the whole run of underscores.
    end = start + len(SEPARATOR)
    while end < len(job_id) and job_id[end] == "_":
        end += 1
    kind, key_part = job_id[: end - len(SEPARATOR)], job_id[end:]
    if _PLAIN_KEY.fullmatch(key_part):
        return kind, key_part
    if not key_part.startswith(_ESCAPE):
        raise ValueError("not a fire-and-forget job id: the dedupe key part is malformed")
    raw = bytearray()
    position = 1
    while position < len(key_part):
        char = key_part[position]
        if char == _ESCAPE:
            hex_digits = key_part[position + 1 : position + 3]
            if not re.fullmatch(r"[0-9a-f]{2}", hex_digits):
                raise ValueError("not a fire-and-forget job id: bad escape in the dedupe key part")
            raw.append(int(hex_digits, 16))
            position += 3
        elif _KEPT_WHEN_ESCAPING.fullmatch(char):
            raw.extend(char.encode())
            position += 1
        else:
            raise ValueError("not a fire-and-forget job id: bad character in the dedupe key part")
    key = raw.decode("utf-8", "surrogatepass")
    if job_id_for(kind, key) != job_id:  # e.g. an escaped form of a plain key
        raise ValueError("not a fire-and-forget job id: the dedupe key part is not in canonical form")
    return kind, key
