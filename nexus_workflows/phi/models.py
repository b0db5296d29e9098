"""Token maps: one per conversation code, with its sequence and its tokens.

No plaintext is stored: a token row holds an HMAC of (code, category, normalised value)
as its lookup key and the surface encrypted with Fernet. Races are settled by a
conditional UPDATE on ``sequence`` as compare-and-set, unique constraints and savepoints —
no ``select_for_update``. The ORM writes everything, except that on PostgreSQL the
compare-and-set and the token's insert go as one statement (see ``service.claim``).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from nexus_workflows.phi.normalization import CATEGORIES
from nexus_workflows.phi.tokens import TOKEN_MAX_LENGTH

CATEGORY_CHOICES = [(category, category) for category in CATEGORIES]


class TokenMapQuerySet(models.QuerySet["TokenMap"]):
    def for_code(self, code: str) -> TokenMapQuerySet:
        """The map of a conversation code, found by the code's keyed hash."""
        from nexus_workflows.phi.keys import code_hash

        return self.filter(code_hash=code_hash(code))


class TokenMap(models.Model):
    """The token map of one conversation code.

    The code is often the patient's messaging address, so only its keyed hash is stored
    (HMAC-SHA256 under a key derived from ``PHI_HMAC_KEY``): a map is found from the code,
    never the other way round.
    """

    code_hash = models.CharField(max_length=64, unique=True)
    # The last token number handed out; tokens of every category share it.
    sequence = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Set explicitly by every write: QuerySet.update() does not apply auto_now.
    updated_at = models.DateTimeField(default=timezone.now)

    objects = TokenMapQuerySet.as_manager()

    class Meta:
        verbose_name = "PHI token map"
        verbose_name_plural = "PHI token maps"

    def __str__(self) -> str:
        # Never the code: this is what admin pages and log entries show.
        return f"token map #{self.pk}"


class PhiToken(models.Model):
    """One value of one conversation: its token, its lookup key, its encrypted surface."""

    # No index of its own: the unique constraints below lead with token_map and serve
    # every lookup by map, so a third index would only slow down each allocation.
    token_map = models.ForeignKey(TokenMap, on_delete=models.CASCADE, related_name="tokens", db_index=False)
    category = models.CharField(max_length=16, choices=CATEGORY_CHOICES)
    number = models.PositiveBigIntegerField()
    token = models.CharField(max_length=TOKEN_MAX_LENGTH)
    # Hex HMAC-SHA256 of (code, category, normalised value) under PHI_HMAC_KEY.
    lookup_key = models.CharField(max_length=64)
    # Fernet token (MultiFernet, newest key first) of the lookup key and the surface.
    encrypted_surface = models.TextField()
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "PHI token"
        verbose_name_plural = "PHI tokens"
        constraints = [
            models.UniqueConstraint(fields=["token_map", "lookup_key"], name="nw_phi_unique_lookup_key"),
            models.UniqueConstraint(fields=["token_map", "token"], name="nw_phi_unique_token"),
        ]
        permissions = [
            ("reveal_phitoken", "Can reveal the decrypted surface of a PHI token"),
        ]

    def __str__(self) -> str:
        return self.token
