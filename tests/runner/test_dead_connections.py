"""The TCP settings ``runworkflows`` gives its own PostgreSQL connections so that a silent
network drops them within a bound (nexus_workflows/deferred/runner/dead_connections.py).
What they do against a real blackhole: tests/faults/test_partition_failover.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections

from nexus_workflows.deferred.runner.dead_connections import (
    describe,
    detect_dead_connections,
    dropped_within,
    tcp_parameters,
)
from nexus_workflows.numbers import MAX_SECONDS


def test_the_user_timeout_is_a_tenth_of_stale_after_and_keepalives_probe_three_times_within_it() -> None:
    assert tcp_parameters(300) == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
    }
    assert dropped_within(300) == 40
    assert tcp_parameters(20)["tcp_user_timeout"] == 2000
    assert dropped_within(20) == 3


def test_the_user_timeout_stays_within_a_second_and_five_minutes() -> None:
    # Below a second a busy network's stall would count as an outage; keepalive times
    # above 32,767 s make the kernel refuse the option (and libpq the connection).
    assert tcp_parameters(0.5)["tcp_user_timeout"] == 1000
    assert tcp_parameters(0.5)["keepalives_idle"] == 1
    assert tcp_parameters(MAX_SECONDS)["tcp_user_timeout"] == 300_000
    assert tcp_parameters(MAX_SECONDS)["keepalives_interval"] == 100


def test_the_start_line_says_whose_settings_apply() -> None:
    assert describe(tcp_parameters(300), 300) == "dropped within 40s (TCP keepalives, tcp_user_timeout)"
    assert describe({"tcp_user_timeout": 0}, 300) == "the database OPTIONS' TCP settings"
    assert describe({"sslmode": "require"}, 300).startswith("the kernel's TCP defaults")


def dsn_of_a_new_connection(alias: str) -> str:
    """The connection string of a connection a new thread opens (as a runner's threads do)."""
    found: dict[str, Any] = {}

    def connect() -> None:
        connection = connections[alias]
        try:
            connection.ensure_connection()
            found["dsn"] = connection.connection.info.dsn
        finally:
            connection.close()

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join()
    return found["dsn"]


@pytest.mark.django_db(transaction=True)
def test_new_connections_of_the_runners_aliases_get_them_while_it_runs() -> None:
    options_before = connections["default"].settings_dict["OPTIONS"]
    with detect_dead_connections(["default", "default"], 20) as changed:
        if connections["default"].vendor != "postgresql":
            assert changed == []  # SQLite: no TCP
            assert connections["default"].settings_dict["OPTIONS"] is options_before
            return
        assert changed == ["default"]
        dsn = dsn_of_a_new_connection("default")
        assert "tcp_user_timeout=2000" in dsn
        assert "keepalives_idle=1" in dsn
    assert connections["default"].settings_dict["OPTIONS"] is options_before  # restored
    assert "tcp_user_timeout" not in dsn_of_a_new_connection("default")


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql
def test_an_alias_whose_options_name_any_of_them_is_left_as_the_project_set_it() -> None:
    settings_dict = connections["default"].settings_dict
    options_before = settings_dict["OPTIONS"]
    settings_dict["OPTIONS"] = {**options_before, "keepalives_idle": 600}
    try:
        with detect_dead_connections(["default"], 20) as changed:
            assert changed == []
            dsn = dsn_of_a_new_connection("default")
        assert "keepalives_idle=600" in dsn
        assert "tcp_user_timeout" not in dsn
    finally:
        settings_dict["OPTIONS"] = options_before
