"""Noticing a PostgreSQL connection that went silent.

A network that drops packets without a word (a failover that moved a virtual IP or a DNS
name, a security-group change, a NAT table that lost its state) sends no RST: a client
waits for an answer until its kernel gives up retransmitting (``tcp_retries2``: about 15
minutes on Linux) and on an idle connection it waits for ever. A runner would meanwhile
claim nothing, and write nothing, with every connection it has.

``runworkflows`` therefore gives the connections of its own aliases libpq's TCP
keepalives and ``tcp_user_timeout`` (:func:`tcp_parameters`, derived from
``STALE_AFTER``), unless the alias's ``OPTIONS`` name any of them: then the project has
chosen (``"tcp_user_timeout": 0`` leaves the kernel's defaults). The kernel drops such a
connection once sent data has gone unacknowledged for ``tcp_user_timeout``, or the
keepalive probes of a connection waiting for an answer (or idle) have gone unanswered as
long; the statement fails with ``OperationalError``, an outage like any other, and the
next one reconnects. A slow statement is never cut short: the server's kernel
acknowledges and answers probes while its backend works.

Behind a user-space pooler (PgBouncer) these see only the path to the pooler, which
acknowledges everything itself: the pooler's own settings must watch its server
connections (see the README, "Behind a connection pooler").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from django.db import connections

#: libpq's parameters for dead-connection detection; a project that sets any of them on
#: an alias keeps all of them its own.
TCP_PARAMETERS = (
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
#: ``tcp_user_timeout`` is a tenth of STALE_AFTER, within these bounds (seconds): a network
#: stall shorter than a second is no outage, and beyond five minutes nothing is gained on
#: the kernel's own limit worth its wait.
SHORTEST_TIMEOUT = 1.0
LONGEST_TIMEOUT = 300.0
#: Keepalive probes unanswered before the kernel gives up, where it has no user timeout.
KEEPALIVE_PROBES = 3


def user_timeout(stale_after: float) -> float:
    """Seconds sent data may stay unacknowledged before the connection is dropped."""
    return min(max(stale_after / 10, SHORTEST_TIMEOUT), LONGEST_TIMEOUT)


def probe_interval(stale_after: float) -> int:
    """Whole seconds (libpq's unit) of silence before the first keepalive probe, and between probes."""
    return max(1, round(user_timeout(stale_after) / 3))


def tcp_parameters(stale_after: float) -> dict[str, int]:
    """libpq's connection parameters for a runner whose claims go stale after ``stale_after``."""
    probe = probe_interval(stale_after)
    return {
        "keepalives": 1,
        "keepalives_idle": probe,
        "keepalives_interval": probe,
        "keepalives_count": KEEPALIVE_PROBES,
        "tcp_user_timeout": round(user_timeout(stale_after) * 1000),
    }


def dropped_within(stale_after: float) -> float:
    """Seconds within which a silent connection with :func:`tcp_parameters` is dropped:
    the user timeout, plus at most one probe interval for the keepalive timer to see it
    (a statement waiting for its answer, an idle connection)."""
    return user_timeout(stale_after) + probe_interval(stale_after)


def describe(options: Mapping[str, Any], stale_after: float) -> str:
    """How an alias with these ``OPTIONS`` notices a silent connection, for the start line."""
    if all(options.get(name) == value for name, value in tcp_parameters(stale_after).items()):
        return f"dropped within {dropped_within(stale_after):g}s (TCP keepalives, tcp_user_timeout)"
    if any(name in options for name in TCP_PARAMETERS):
        return "the database OPTIONS' TCP settings"
    return "the kernel's TCP defaults (a silent network may block a statement for ~15 min)"


@contextlib.contextmanager
def detect_dead_connections(aliases: Iterable[str], stale_after: float) -> Iterator[list[str]]:
    """While it lasts, new connections of each PostgreSQL alias among ``aliases`` whose
    ``OPTIONS`` name none of :data:`TCP_PARAMETERS` get :func:`tcp_parameters`; yields the
    aliases changed. This thread's connection to them, if open and in no transaction, is
    closed so that its next query reconnects with them. The settings are restored
    afterwards (connections opened meanwhile keep theirs)."""
    changed: dict[str, dict[str, Any]] = {}
    try:
        for alias in dict.fromkeys(aliases):
            connection = connections[alias]
            options = connection.settings_dict.setdefault("OPTIONS", {})  # Django's default
            if connection.vendor != "postgresql" or any(name in options for name in TCP_PARAMETERS):
                continue  # not libpq, or the project's own choice
            changed[alias] = options
            # A new dict: the project's own OPTIONS object stays as it was.
            connection.settings_dict["OPTIONS"] = {**options, **tcp_parameters(stale_after)}
            if connection.connection is not None and not connection.in_atomic_block:
                connection.close()
        yield list(changed)
    finally:
        for alias, options in changed.items():
            connections[alias].settings_dict["OPTIONS"] = options
