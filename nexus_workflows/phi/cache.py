"""The per-process token map cache: a bounded TTL cache with single-flight loading.

A code's map is loaded with one query and kept for ``PHI_CACHE_TTL`` seconds, so repeat
encodes and decodes of a conversation make no query. Mappings never change once made,
so a stale entry can only be *missing* a value (the allocation path then finds it in the
database) or hold a less rich surface for up to the TTL. Concurrent loads of one code
share one query: the first caller loads, the others wait for its result.

Surfaces are decrypted lazily, on first use, and kept decrypted in memory only.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from nexus_workflows.conf import SETTINGS_NAME, app_settings
from nexus_workflows.phi.keys import keyring


@dataclass
class TokenRow:
    """One stored token as the cache knows it."""

    pk: int
    token: str
    lookup_key: str
    ciphertext: str
    # Plaintext: out of the repr, which ends up in tracebacks, debuggers and logs.
    _surface: str | None = field(default=None, repr=False)

    def surface(self) -> str:
        """The decrypted surface (memoised); raises ``SurfaceDecryptionError``."""
        if self._surface is None:
            self._surface = keyring().decrypt(self.lookup_key, self.ciphertext, label=f"token #{self.pk}")
        return self._surface


@dataclass
class MapState:
    """What one process knows of one code's token map."""

    map_id: int | None
    sequence: int
    rows: dict[str, TokenRow] = field(default_factory=dict)  # token -> row
    by_lookup: dict[str, str] = field(default_factory=dict)  # lookup key -> token
    # (category, the value exactly as given) -> token: a repeat encode of the same
    # spelling skips normalisation and the HMAC.
    spellings: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)  # plaintext keys
    # A hint, not data: until this monotonic time, allocations look before they claim
    # (another writer was allocating in this map a moment ago).
    contended_until: float = 0.0

    def copy(self) -> MapState:
        return MapState(
            self.map_id, self.sequence, dict(self.rows), dict(self.by_lookup), dict(self.spellings)
        )

    def add(self, row: TokenRow) -> None:
        self.rows[row.token] = row
        self.by_lookup[row.lookup_key] = row.token


class _Flight:
    """A load in progress that other threads can wait for."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.state: MapState | None = None


CacheKey = tuple[str, str]  # (database alias, code)


class TokenCache:
    def __init__(self) -> None:
        self._entries: OrderedDict[CacheKey, tuple[float, MapState]] = OrderedDict()
        self._flights: dict[CacheKey, _Flight] = {}
        self._lock = threading.Lock()
        #: Loads run since the process started (the database queries the cache made).
        self.loads = 0

    def peek(self, key: CacheKey) -> MapState | None:
        """The cached state if it is fresh, without loading."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def get(self, key: CacheKey, load: Callable[[], MapState]) -> MapState:
        """The fresh cached state, or the result of ``load`` shared with concurrent callers."""
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0] > time.monotonic():
                    self._entries.move_to_end(key)
                    return entry[1]
                flight = self._flights.get(key)
                leader = flight is None
                if leader:
                    flight = _Flight()
                    self._flights[key] = flight
            assert flight is not None
            if not leader:
                flight.done.wait()
                if flight.state is not None:
                    return flight.state
                continue  # the leader's load failed: try again (maybe as the leader)
            try:
                state = load()
                flight.state = state
                self._store(key, state)
                return state
            finally:
                with self._lock:
                    del self._flights[key]
                flight.done.set()

    def _store(self, key: CacheKey, state: MapState) -> None:
        ttl = float(app_settings.PHI_CACHE_TTL)
        size = int(app_settings.PHI_CACHE_SIZE)
        with self._lock:
            self.loads += 1
            self._entries[key] = (time.monotonic() + ttl, state)
            self._entries.move_to_end(key)
            while len(self._entries) > size:
                self._entries.popitem(last=False)

    def invalidate(self, key: CacheKey) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


token_cache = TokenCache()


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # override_settings in tests, or a reload: every cached lookup key was computed with
    # the old HMAC key, and the cache's size may differ.
    if setting == SETTINGS_NAME:
        token_cache.clear()
