from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from nexus_workflows.phi import encode
from nexus_workflows.phi.cache import MapState, TokenCache, TokenRow, token_cache
from tests.processes import wait_for

pytestmark = pytest.mark.django_db


def loader(states: list[MapState]) -> Callable[[], MapState]:
    def load() -> MapState:
        state = MapState(map_id=None, sequence=0)
        states.append(state)
        return state

    return load


def test_entries_expire_after_the_ttl() -> None:
    cache, loaded = TokenCache(), []
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_CACHE_TTL": 0.05}):
        first = cache.get(("default", "a"), loader(loaded))
        assert cache.get(("default", "a"), loader(loaded)) is first
        threading.Event().wait(0.1)
        assert cache.peek(("default", "a")) is None
        assert cache.get(("default", "a"), loader(loaded)) is not first
    assert len(loaded) == 2


def test_size_is_bounded_least_recently_used_first() -> None:
    cache, loaded = TokenCache(), []
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_CACHE_SIZE": 2}):
        cache.get(("default", "a"), loader(loaded))
        cache.get(("default", "b"), loader(loaded))
        cache.get(("default", "a"), loader(loaded))  # a is now the most recently used
        cache.get(("default", "c"), loader(loaded))
    assert len(cache) == 2
    assert cache.peek(("default", "b")) is None
    assert cache.peek(("default", "a")) is not None
    assert cache.peek(("default", "c")) is not None


def test_a_failed_load_is_not_cached_and_waiters_retry() -> None:
    cache = TokenCache()
    started, release = threading.Event(), threading.Event()
    # What each thread got, asserted here: an assert in a thread would only end the thread.
    outcomes: dict[str, Any] = {}

    def failing() -> MapState:
        started.set()
        release.wait(5)
        raise RuntimeError("database went away")

    def leader() -> None:
        try:
            outcomes["leader"] = cache.get(("default", "a"), failing)
        except RuntimeError as error:
            outcomes["leader"] = error

    def waiter() -> None:
        outcomes["waiter"] = cache.get(("default", "a"), lambda: MapState(map_id=7, sequence=3))

    first = threading.Thread(target=leader)
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=waiter)
    second.start()
    # Fail the load only once the second caller waits for it (else it would simply load).
    flight = cache._flights[("default", "a")]
    wait_for(lambda: len(flight.done._cond._waiters) == 1, timeout=5, what="the second caller to wait")
    release.set()
    first.join(5)
    second.join(5)
    assert str(outcomes["leader"]) == "database went away"  # its own load's failure
    assert outcomes["waiter"].map_id == 7  # loaded again, not handed the failure
    assert cache.loads == 1


def test_encode_after_the_ttl_reads_the_database_again(
    code: str, django_assert_num_queries: Callable[..., Any]
) -> None:
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_CACHE_TTL": 0.05}):
        token = encode(code, "María López", "PERSONA")
        threading.Event().wait(0.1)
        with django_assert_num_queries(1):
            assert encode(code, "María López", "PERSONA") == token


def test_settings_changes_empty_the_cache(code: str) -> None:
    encode(code, "María López", "PERSONA")
    assert len(token_cache) == 1
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_DEFAULT_REGION": "US"}):
        assert len(token_cache) == 0


def test_reprs_of_cached_rows_and_maps_hold_no_plaintext() -> None:
    # A repr lands in tracebacks (locals), debuggers and log lines.
    row = TokenRow(7, "<<PERSONA_1>>", "lookup-hmac", "ciphertext", _surface="María López")
    state = MapState(map_id=1, sequence=1)
    state.add(row)
    state.spellings[("PERSONA", "María López")] = "<<PERSONA_1>>"
    for text in (repr(row), repr(state), repr(state.copy())):
        assert "María" not in text
        assert "<<PERSONA_1>>" in text  # the rest is still there to debug with
