"""Exceptions of the PHI token maps.

Messages say what was wrong and what is allowed, but never carry the value, its
surface or its normalised form: these exceptions end up in logs and error trackers.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class PhiError(Exception):
    """Base class of every error raised by :mod:`nexus_workflows.phi`."""


class InvalidCategory(PhiError, ValueError):
    """The category is not one of ``CATEGORIES``."""


class InvalidCode(PhiError, ValueError):
    """The conversation code is missing, empty or unusable."""


class InvalidPhiValue(PhiError, ValueError):
    """The value is ``None``, empty, of the wrong type, or normalises to nothing."""


class InvalidText(PhiError, ValueError):
    """The text given to ``decode`` or ``encode_text`` is not a string."""


class InvalidSpan(PhiError, ValueError):
    """A span given to ``encode_text`` is malformed, out of range or overlaps another."""


class SurfaceDecryptionError(PhiError):
    """A stored surface cannot be decrypted (wrong or removed key, or tampered data).

    Raised instead of ever returning ciphertext as if it were the value.
    """


class TokenAllocationError(PhiError):
    """A token could not be allocated because concurrent writers kept winning the race."""


class PhiConfigurationError(PhiError, ImproperlyConfigured):
    """The PHI keys are missing or unusable (the system checks report the same problems)."""
