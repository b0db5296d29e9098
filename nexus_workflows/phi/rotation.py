"""Re-encrypt every stored surface under the newest PHI encryption key.

Run after putting a new key first in ``PHI_ENCRYPTION_KEYS``; once it has finished
without failures, the old keys can be removed. Rows already under the newest key are
skipped, so an interrupted rotation can simply be run again. Each row is rewritten by
compare-and-set on its ciphertext, so a surface upgraded concurrently is never lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import router
from django.utils import timezone

from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.exceptions import SurfaceDecryptionError
from nexus_workflows.phi.keys import Keyring, keyring
from nexus_workflows.phi.models import PhiToken

logger = logging.getLogger(__name__)

# Rounds per row when a concurrent surface upgrade keeps replacing the ciphertext.
_ROUNDS = 10


@dataclass
class RotationResult:
    #: Rows moved from an older key to the newest one.
    rotated: int = 0
    #: Rows already under the newest key, re-encrypted only to be padded (stored before
    #: padding, 2026-12) or, with PHI_PADDING off, unpadded.
    reformatted: int = 0
    already_current: int = 0
    #: Primary keys of rows no configured key can decrypt (left untouched).
    failed: list[int] = field(default_factory=list)

    @property
    def examined(self) -> int:
        return self.rotated + self.reformatted + self.already_current + len(self.failed)


def rotate_keys(*, batch_size: int = 500, using: str | None = None) -> RotationResult:
    alias = using or router.db_for_write(PhiToken)
    ring = keyring()
    result = RotationResult()
    last_pk = 0
    while True:
        batch = list(
            PhiToken.objects.using(alias)
            .filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "encrypted_surface")[:batch_size]
        )
        if not batch:
            break
        for pk, ciphertext in batch:
            last_pk = pk
            _rotate_row(alias, ring, pk, ciphertext, result)
    # This process's cached ciphertexts are stale now; other processes find out at
    # their next compare-and-set (or within PHI_CACHE_TTL).
    token_cache.clear()
    logger.info(
        "PHI key rotation: %d rotated, %d already under the newest key (%d of them reformatted), "
        "%d undecryptable",
        result.rotated,
        result.already_current + result.reformatted,
        result.reformatted,
        len(result.failed),
    )
    return result


def _rotate_row(alias: str, ring: Keyring, pk: int, ciphertext: str, result: RotationResult) -> None:
    for _ in range(_ROUNDS):
        try:
            rotated = ring.rotate(ciphertext, label=f"token #{pk}")
        except SurfaceDecryptionError:
            result.failed.append(pk)
            logger.error("PHI key rotation: token #%s cannot be decrypted with any configured key", pk)
            return
        if rotated is None:
            result.already_current += 1
            return
        written = (
            PhiToken.objects.using(alias)
            .filter(pk=pk, encrypted_surface=ciphertext)
            .update(encrypted_surface=rotated.ciphertext, updated_at=timezone.now())
        )
        if written:
            if rotated.from_older_key:
                result.rotated += 1
            else:
                result.reformatted += 1
            return
        current = (
            PhiToken.objects.using(alias).filter(pk=pk).values_list("encrypted_surface", flat=True).first()
        )
        if current is None:
            return  # deleted meanwhile: nothing left to rotate
        ciphertext = current
    result.failed.append(pk)
    logger.error("PHI key rotation: token #%s kept changing; run the rotation again", pk)
