"""The PHI keys: one HMAC key for lookup keys, Fernet keys (newest first) for surfaces.

Keys come from ``NEXUS_WORKFLOWS['PHI_HMAC_KEY']`` and ``['PHI_ENCRYPTION_KEYS']`` (the
development project reads them from the environment). With ``DEBUG`` on and a key unset,
a development key is derived from ``SECRET_KEY`` and a warning is logged; with ``DEBUG``
off that is a configuration error, reported by the system checks and raised at first use.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.crypto import salted_hmac

from nexus_workflows.conf import SETTINGS_NAME, app_settings
from nexus_workflows.phi import padding
from nexus_workflows.phi.exceptions import PhiConfigurationError, SurfaceDecryptionError

logger = logging.getLogger(__name__)

#: Shortest PHI_HMAC_KEY accepted (characters); 32 random characters carry >128 bits.
HMAC_KEY_MIN_LENGTH = 32

_SALT = "nexus_workflows.phi.keys"


@dataclass(frozen=True)
class Rotation:
    """A surface re-encrypted by :meth:`Keyring.rotate`: under an older key before, or
    under the newest one but padded otherwise than ``PHI_PADDING`` says."""

    ciphertext: str = field(repr=False)
    from_older_key: bool


@dataclass(frozen=True)
class KeyProblem:
    """One configuration problem, shared by the system checks and the runtime error."""

    check_id: str
    message: str
    hint: str
    is_error: bool = True


def _as_text(key: Any) -> str | None:
    """A key as text; None for one that is no valid UTF-8 text (bytes that do not decode,
    a string with a lone surrogate, as ``os.environ`` gives for a Latin-1 byte)."""
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(key, str):
        return None
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return key


def _same(key: str, other: str) -> bool:
    """Whether two keys are equal, in constant time: as UTF-8 bytes (``compare_digest``
    refuses strings with any non-ASCII letter), a lone surrogate of a SECRET_KEY kept."""
    return hmac.compare_digest(key.encode("utf-8", "surrogatepass"), other.encode("utf-8", "surrogatepass"))


def configured_encryption_keys() -> list[Any]:
    """PHI_ENCRYPTION_KEYS as a list: a list/tuple, or one comma-separated string."""
    raw = app_settings.PHI_ENCRYPTION_KEYS
    if raw is None:
        return []
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, list | tuple):
        return [key for key in raw if key not in ("", None)]
    return [raw]  # reported as a key of the wrong type


def key_problems() -> list[KeyProblem]:
    """Every problem with the configured keys (empty when they are usable)."""
    # Long function: a flat list of independent key checks, each with its hint.
    debug = bool(settings.DEBUG)
    secret = str(getattr(settings, "SECRET_KEY", "") or "")
    problems: list[KeyProblem] = []
    hmac_key = app_settings.PHI_HMAC_KEY
    hmac_text = _as_text(hmac_key)
    if hmac_key in (None, "", b""):
        if not debug:
            problems.append(
                KeyProblem(
                    "nexus_workflows.E100",
                    f"{SETTINGS_NAME}['PHI_HMAC_KEY'] is not set and DEBUG is off.",
                    "Set PHI_HMAC_KEY (at least 32 random characters, not the SECRET_KEY), e.g. "
                    "from `python -c 'import secrets; print(secrets.token_urlsafe(48))'`.",
                )
            )
        hmac_text = None
    elif hmac_text is None or len(hmac_text) < HMAC_KEY_MIN_LENGTH:
        problems.append(
            KeyProblem(
                "nexus_workflows.E104",
                f"{SETTINGS_NAME}['PHI_HMAC_KEY'] must be a string of at least "
                f"{HMAC_KEY_MIN_LENGTH} characters, valid Unicode text.",
                "Generate one with `python -c 'import secrets; print(secrets.token_urlsafe(48))'`.",
            )
        )
    elif secret and _same(hmac_text, secret):
        problems.append(
            KeyProblem(
                "nexus_workflows.E102",
                f"{SETTINGS_NAME}['PHI_HMAC_KEY'] is the SECRET_KEY.",
                "Use a dedicated key: a leaked SECRET_KEY must not also expose the PHI lookup keys.",
            )
        )

    raw_keys = app_settings.PHI_ENCRYPTION_KEYS
    encryption_keys = configured_encryption_keys()
    if raw_keys not in (None, "") and not isinstance(raw_keys, str | list | tuple):
        problems.append(
            KeyProblem(
                "nexus_workflows.E103",
                f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] must be a list of Fernet keys (newest first) "
                f"or one comma-separated string; got {type(raw_keys).__name__}.",
                "Generate a key with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`.",
            )
        )
        encryption_keys = []
    if not encryption_keys and not debug:
        problems.append(
            KeyProblem(
                "nexus_workflows.E101",
                f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] is not set and DEBUG is off.",
                "Set PHI_ENCRYPTION_KEYS to one or more Fernet keys, newest first, generated with "
                "`python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`.",
            )
        )
    seen: set[str] = set()
    for position, key in enumerate(encryption_keys, start=1):
        text = _as_text(key)
        try:
            Fernet(key)
        except (ValueError, TypeError):
            problems.append(
                KeyProblem(
                    "nexus_workflows.E103",
                    f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] entry {position} is not a Fernet key "
                    "(32 url-safe base64-encoded bytes).",
                    "Generate one with `python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())'`.",
                )
            )
            continue
        assert text is not None  # Fernet accepted it, so it is ASCII text or bytes
        if secret and _same(text, secret):
            problems.append(
                KeyProblem(
                    "nexus_workflows.E102",
                    f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] entry {position} is the SECRET_KEY.",
                    "Use dedicated keys: a leaked SECRET_KEY must not also decrypt the PHI surfaces.",
                )
            )
        if hmac_text is not None and _same(text, hmac_text):
            problems.append(
                KeyProblem(
                    "nexus_workflows.E105",
                    f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] entry {position} is also the PHI_HMAC_KEY.",
                    "The lookup-key HMAC needs a key of its own.",
                )
            )
        if text in seen:
            problems.append(
                KeyProblem(
                    "nexus_workflows.W100",
                    f"{SETTINGS_NAME}['PHI_ENCRYPTION_KEYS'] entry {position} repeats an earlier key.",
                    "List each key once, newest first.",
                    is_error=False,
                )
            )
        seen.add(text)
    return problems


#: What the conversation-code key is derived from PHI_HMAC_KEY with. Changing it (or the
#: HMAC key) makes every stored map unreachable: codes are only stored as these hashes.
CODE_HASH_CONTEXT = b"nexus_workflows.phi conversation code v1"


class Keyring:
    """The usable keys and the operations on them."""

    def __init__(self, hmac_key: bytes, fernet_keys: list[bytes | str], *, pad: bool = True) -> None:
        # Whether new plaintexts are padded (PHI_PADDING); both formats are always read.
        self.pad = pad
        # Keyed once; each lookup key copies this state instead of re-keying.
        self._hmac = hmac.new(hmac_key, digestmod=hashlib.sha256)
        # Codes get a key of their own, derived from the HMAC key, so a code's hash can
        # never equal any lookup key.
        code_key = hmac.new(hmac_key, CODE_HASH_CONTEXT, hashlib.sha256).digest()
        self._code_hmac = hmac.new(code_key, digestmod=hashlib.sha256)
        # Flow-control key hashes get a key of their own, derived from the HMAC key, so
        # that no flow hash can ever equal a PHI lookup key.
        flow_key = hmac.new(hmac_key, b"nexus_workflows flow-control key hashes", hashlib.sha256).digest()
        self._flow_hmac = hmac.new(flow_key, digestmod=hashlib.sha256)
        fernets = [Fernet(key) for key in fernet_keys]
        self._newest = fernets[0]
        self._fernet = MultiFernet(fernets)

    def lookup_key(self, code: str, category: str, normalized: str) -> str:
        """HMAC-SHA256 of (code, category, normalised value), hex.

        The code is length-prefixed so that no two triples share a message; including it
        means one person's lookup keys differ between conversations, so a database dump
        cannot link conversations through them.
        """
        mac = self._hmac.copy()
        mac.update(f"{len(code)}:{code}|{category}|{normalized}".encode())
        return mac.hexdigest()

    def code_hash(self, code: str) -> str:
        """HMAC-SHA256 of a conversation code under its own key, hex: how a map is stored
        and found. The code itself is never stored."""
        mac = self._code_hmac.copy()
        mac.update(code.encode())
        return mac.hexdigest()

    def flow_key_hash(self, kind: str, purpose: str, key: str) -> str:
        """HMAC-SHA256 of a workflow's key for ``purpose`` (a serial or rate key; a job id
        in the audit log), hex: equal keys of one kind and purpose hash alike, and the key
        (often a phone number) is never stored."""
        mac = self._flow_hmac.copy()
        mac.update(f"{len(kind)}:{kind}|{purpose}|{key}".encode())
        return mac.hexdigest()

    def seal(self, context: str, text: str) -> str:
        """``text`` encrypted under the newest key with ``context`` sealed in: opening it
        under any other context fails, so a ciphertext copied elsewhere reveals nothing."""
        return self._encrypt(padding.sealed_plaintext(context, text, pad=self.pad))

    def unseal(self, context: str, ciphertext: str) -> str | None:
        """What :meth:`seal` sealed under ``context``; ``None`` if no configured key opens
        it or it was sealed under another context (callers raise their own error)."""
        plain = self._open(ciphertext)
        return None if plain is None else padding.read_sealed(context, plain)

    def _open(self, ciphertext: str) -> str | None:
        try:
            return self._fernet.decrypt(ciphertext.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError):
            return None

    def encrypt(self, lookup_key: str, surface: str) -> str:
        # The lookup key is sealed in with the surface, so a ciphertext copied onto
        # another token's row fails to decrypt instead of decoding to the wrong person.
        return self._encrypt(padding.surface_plaintext(lookup_key, surface, pad=self.pad))

    def decrypt(self, lookup_key: str, ciphertext: str, *, label: str) -> str:
        """The surface; raises :class:`SurfaceDecryptionError`, never returns ciphertext."""
        plain = self._open(ciphertext)
        if plain is None:
            raise SurfaceDecryptionError(
                f"the stored surface of {label} cannot be decrypted with any configured PHI "
                "encryption key (was a key removed before `manage.py rotate_phi_keys` ran?)"
            )
        surface = padding.read_surface(lookup_key, plain)
        if surface is None:
            raise SurfaceDecryptionError(
                f"the stored surface of {label} belongs to another token (the row was altered)"
            )
        return surface

    def rotate(self, ciphertext: str, *, label: str) -> Rotation | None:
        """The ciphertext re-encrypted under the newest key, padded or not as
        ``PHI_PADDING`` says; None if it already is both."""
        token = ciphertext.encode("ascii")
        try:
            under_newest: bytes | None = self._newest.decrypt(token)
        except InvalidToken:
            under_newest = None
        if under_newest is not None:
            # Current when in the setting's format too (or in none this app writes, which
            # decrypting reports and rotating would not mend).
            plain = padding.reformat_surface(under_newest, pad=self.pad)
            return None if plain == under_newest else Rotation(self._encrypt(plain), from_older_key=False)
        try:
            plain = self._fernet.decrypt(token)
        except InvalidToken:
            raise SurfaceDecryptionError(
                f"the stored surface of {label} cannot be decrypted with any configured PHI "
                "encryption key, so it cannot be rotated"
            ) from None
        return Rotation(self._encrypt(padding.reformat_surface(plain, pad=self.pad)), from_older_key=True)

    def _encrypt(self, plain: bytes) -> str:
        return self._fernet.encrypt(plain).decode("ascii")


def _derived_hmac_key() -> bytes:
    return salted_hmac(_SALT, "lookup-hmac-key", algorithm="sha256").digest()


def _derived_fernet_key() -> bytes:
    return base64.urlsafe_b64encode(salted_hmac(_SALT, "surface-fernet-key", algorithm="sha256").digest())


def build_keyring() -> Keyring:
    errors = [problem for problem in key_problems() if problem.is_error]
    if errors:
        raise PhiConfigurationError(f"{errors[0].message} {errors[0].hint} ({errors[0].check_id})")
    derived = []
    hmac_text = _as_text(app_settings.PHI_HMAC_KEY)
    if hmac_text:
        hmac_key = hmac_text.encode("utf-8")
    else:
        hmac_key = _derived_hmac_key()
        derived.append("PHI_HMAC_KEY")
    fernet_keys = configured_encryption_keys()
    if not fernet_keys:
        fernet_keys = [_derived_fernet_key()]
        derived.append("PHI_ENCRYPTION_KEYS")
    if derived:
        logger.warning(
            "DEBUG is on and %s %s not set: using development keys derived from SECRET_KEY. "
            "Set real keys before handling patient data.",
            " and ".join(derived),
            "is" if len(derived) == 1 else "are",
        )
    # Anything but False pads (E109 reports a setting that is not a bool).
    return Keyring(hmac_key, fernet_keys, pad=app_settings.PHI_PADDING is not False)


_keyring: Keyring | None = None
_keyring_lock = threading.Lock()


def keyring() -> Keyring:
    """The process's keyring, built on first use and again after a settings change."""
    global _keyring
    current = _keyring
    if current is None:
        with _keyring_lock:
            if _keyring is None:
                _keyring = build_keyring()
            current = _keyring
    return current


def reset_keyring() -> None:
    global _keyring
    with _keyring_lock:
        _keyring = None


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # override_settings in tests, or a reload: keys, region and cache size may differ,
    # and every cached lookup key was computed with the old HMAC key.
    if setting in (SETTINGS_NAME, "SECRET_KEY", "DEBUG", "SECRET_KEY_FALLBACKS"):
        reset_keyring()  # (phi.cache clears its token cache on the same signal)


def code_hash(code: str) -> str:
    """The stored form of a (validated) conversation code."""
    return keyring().code_hash(code)
