"""The plaintext formats of surfaces and sealed values, padded and not.

Fernet rounds a ciphertext to 16 bytes only, so its length tells a short name from a long
one. Plaintexts are padded to a multiple of :data:`PAD_TO` bytes before encryption
(``PHI_PADDING``, on by default): every surface of up to about 60 bytes then encrypts to
the same length.

A surface's plaintext is its lookup key, then ``|``, the surface's length, ``:``, the
surface and spaces; before padding (until 2026-12) it was the lookup key, ``:`` and the
surface. A sealed value's is ``<len(context)>|<context>`` then the same length-prefixed,
padded text; before padding, ``<len(context)>:<context><text>``. Both are read whatever the
setting; code from before padding reads only the second.
"""

from __future__ import annotations

PAD_TO = 64
PADDED, UNPADDED = "|", ":"
#: A lookup key is an HMAC-SHA256 in hex.
LOOKUP_KEY_LENGTH = 64
#: Any str's length has at most 19 digits.
_MOST_LENGTH_DIGITS = 19


def padded(head: str, text: str) -> bytes:
    """``head``, the length of ``text``, ``:``, ``text``, then spaces up to a multiple of PAD_TO."""
    body = f"{head}{len(text)}:{text}".encode()
    return body + b" " * (-len(body) % PAD_TO)


def unpadded(rest: str) -> str | None:
    """The text :func:`padded` wrote after its head; None if ``rest`` is not that."""
    number, colon, tail = rest.partition(":")
    if not colon or not (number.isascii() and number.isdigit()) or len(number) > _MOST_LENGTH_DIGITS:
        return None
    length = int(number)
    if len(tail) < length or tail[length:].strip(" "):
        return None
    return tail[:length]


def surface_head(lookup_key: str, *, pad: bool) -> str:
    return f"{lookup_key}{PADDED if pad else UNPADDED}"


def surface_plaintext(lookup_key: str, surface: str, *, pad: bool) -> bytes:
    if pad:
        return padded(surface_head(lookup_key, pad=True), surface)
    return f"{surface_head(lookup_key, pad=False)}{surface}".encode()


def read_surface(lookup_key: str, plain: str) -> str | None:
    """The surface in ``plain`` if it is ``lookup_key``'s, in either format; else None."""
    if plain.startswith(surface_head(lookup_key, pad=True)):
        return unpadded(plain[len(lookup_key) + 1 :])
    if plain.startswith(surface_head(lookup_key, pad=False)):
        return plain[len(lookup_key) + 1 :]
    return None


def is_padded_surface(plain: bytes) -> bool:
    return plain[LOOKUP_KEY_LENGTH : LOOKUP_KEY_LENGTH + 1] == PADDED.encode()


def reformat_surface(plain: bytes, *, pad: bool) -> bytes:
    """A surface's plaintext in the format ``pad`` asks for; any other plaintext as it is
    (not UTF-8, or not a surface this app wrote: decrypting it will say so)."""
    if is_padded_surface(plain) == pad:
        return plain
    try:
        lookup_key = plain[:LOOKUP_KEY_LENGTH].decode("ascii")
        surface = read_surface(lookup_key, plain.decode())
    except UnicodeError:
        return plain
    return plain if surface is None else surface_plaintext(lookup_key, surface, pad=pad)


def sealed_plaintext(context: str, text: str, *, pad: bool) -> bytes:
    if pad:
        return padded(f"{len(context)}{PADDED}{context}", text)
    return f"{len(context)}{UNPADDED}{context}{text}".encode()


def read_sealed(context: str, plain: str) -> str | None:
    """The text sealed under ``context`` in ``plain``, in either format; else None."""
    head = f"{len(context)}{PADDED}{context}"
    if plain.startswith(head):
        return unpadded(plain[len(head) :])
    head = f"{len(context)}{UNPADDED}{context}"
    return plain[len(head) :] if plain.startswith(head) else None
