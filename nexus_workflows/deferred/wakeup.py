"""Waking idle runners as soon as work is enqueued.

Polling alone makes an idle runner start new work up to ``POLL_INTERVAL`` late. On
PostgreSQL, a statement trigger on the work table sends ``NOTIFY nexus_workflows`` for
every ``INSERT`` (so an enqueue costs no extra round trip; delivered at commit, dropped on
rollback; the payload names the row, ``"<id> <kind>"``, when the statement inserted one,
so an idle runner claims it by id in one statement), :func:`notify` sends one when
existing work becomes due (revive, run now, release), and every runner ``LISTEN``\\s on a
connection of its own, so new work starts within milliseconds. Runners in the same
process are woken through an in-process event, on every database. Other databases fall
back to polling.

``LISTEN`` is session state: behind a pooler in transaction mode (PgBouncer) the
registration lands on a server connection the listener no longer holds, and every
``NOTIFY`` is lost. So the listener connects to ``WAKEUP_DATABASE`` (an alias pointing
straight at PostgreSQL) when it is set, and never trusts an unproven connection: after
every ``LISTEN`` it sends a probe ``NOTIFY`` the way enqueues send theirs (a connection of
the runner's own alias, through the pooler if there is one) and waits for it. A probe
that does not arrive is reported once, and the runner polls every
``WAKEUP_FALLBACK_POLL_INTERVAL`` until a later probe arrives.

An enqueue pays for its ``NOTIFY`` only while some runner waits for one: a listening
runner with nothing to claim holds an advisory lock on its ``LISTEN`` session
(:data:`~nexus_workflows.sql.postgresql.WAITING_LOCK`), and the trigger notifies only
when it cannot take that lock. Taking it waits for every enqueue that did not notify, and
the runner claims once more once it holds it, so no wake-up is lost; a runner with a
backlog lets it go, since it claims again by itself (migration 0011). A busy runner holds,
the same way, a lock for each limited kind it rests (:mod:`.rest_locks`, migration 0017).
"""

# Long module: the listener thread (its connection, probes, waiting and rest locks) and the
# notify side it answers, kept together so the wake-up protocol reads in one place.

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from django.db import connections, transaction

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.rest_locks import RestLocks
from nexus_workflows.sql import postgresql

logger = logging.getLogger("nexus_workflows.wakeup")  # the name it has always logged under

CHANNEL = "nexus_workflows"
#: Payload prefix of a listener's probe; other listeners ignore probes that are not theirs.
PROBE_PREFIX = "probe:"
#: Seconds a listener waits for its probe before it reports wake-ups as not arriving.
PROBE_TIMEOUT = 2.0
#: Seconds between probes while wake-ups do not arrive (and after a probe could not be sent).
REPROBE_INTERVAL = 30.0
#: Seconds the listener waits for the waiting lock, held back by an enqueue whose
#: transaction is still open, before it tries again (the runner polls briefly meanwhile).
WAITING_LOCK_TIMEOUT = 1.0
#: Seconds between the listener's checks that it should stop, when nothing else wakes it.
LISTEN_TURN = 0.5

_local_waiters: weakref.WeakSet[threading.Event] = weakref.WeakSet()
_local_waiters_lock = threading.Lock()


def add_local_waiter(event: threading.Event) -> None:
    with _local_waiters_lock:
        _local_waiters.add(event)


def remove_local_waiter(event: threading.Event) -> None:
    with _local_waiters_lock:
        _local_waiters.discard(event)


def _wake_local_waiters() -> None:
    with _local_waiters_lock:
        waiters = list(_local_waiters)
    for event in waiters:
        event.set()


def notify(using: str, *, inserted: bool = False) -> None:
    """Tell runners that work is due now; call after writing it on ``using``.

    ``inserted``: just inserted, so on PostgreSQL the trigger sent the NOTIFY if a runner
    waits, or rests a kind inserted (:mod:`.rest_locks`)."""
    connection = connections[using]
    if connection.vendor == "postgresql" and not inserted and app_settings.WAKEUP:
        with connection.cursor() as cursor:
            postgresql.notify(cursor, CHANNEL)
    if _local_waiters:
        transaction.on_commit(_wake_local_waiters, using=using)


class WakeupMode(StrEnum):
    """How a runner learns that work is due; shown in its start line and in status."""

    #: Listening, and a probe sent from another connection arrived: wake-ups work.
    LISTENING = "listening"
    #: Listening, but the probe did not arrive (a pooler in transaction mode?), or the
    #: listener cannot connect: polling every WAKEUP_FALLBACK_POLL_INTERVAL.
    SHORT_POLL = "short-poll"
    #: The listener has not proven its connection yet.
    STARTING = "starting"
    #: No listener (not PostgreSQL, WAKEUP off, or --once): polling every POLL_INTERVAL.
    POLL = "poll"


#: Payload prefix of the NOTIFY an ended attempt of a limited kind sends (migration 0020):
#: ``"ended <kind>"``, the same for every row of the kind, so PostgreSQL delivers it once
#: per transaction however many rows of the kind ended in it (identical payloads merge).
ENDED_PREFIX = "ended "


def parse_ended(payload: str) -> str | None:
    """The kind an ``"ended <kind>"`` payload names (an attempt of it ended); None for any
    other payload."""
    if not payload.startswith(ENDED_PREFIX) or len(payload) == len(ENDED_PREFIX):
        return None
    return payload[len(ENDED_PREFIX) :]


def parse_new_work(payload: str) -> tuple[int, str, str | None] | None:
    """(id, kind, queue) from the NOTIFY of an INSERT of one row: ``"<id> <kind>"`` for a
    workflow (queue None, see migration 0009), ``"<id> <task path> <queue>"`` for a Django
    task (migration 0021; before it, a task's queue was not named: None); None for any
    other payload (many rows, ``notify``, a probe). Neither a kind nor a task path holds
    a space; a queue name may."""
    number, _, named = payload.partition(" ")
    if not named or not number.isdigit():
        return None
    kind, _, queue = named.partition(" ")
    return int(number), kind, (queue or None)


def wakeup_alias(using: str) -> str:
    """The database alias a runner of ``using`` LISTENs on."""
    return app_settings.WAKEUP_DATABASE or using


class PostgresListener(threading.Thread):
    """Sets ``event`` whenever a ``NOTIFY nexus_workflows`` arrives; proves its connection
    with a probe after every (re)connect; reconnects after the database goes away.

    ``using`` is the runner's alias (probes are sent there, as enqueues send their
    NOTIFY); the listener itself connects to :func:`wakeup_alias`, on a connection of its
    own outside Django's (it must stay in one server session).
    """

    def __init__(
        self,
        using: str,
        event: threading.Event,
        *,
        on_mode_change: Callable[[], None] | None = None,
        on_new_work: Callable[[int, str, str | None], bool] | None = None,
        on_kind_ended: Callable[[str], bool] | None = None,
        on_any_work: Callable[[], object] | None = None,
        on_rest_held: Callable[[str], object] | None = None,
        run_db: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(name="nexus-workflows-listener", daemon=True)
        self.using = using
        self.listen_using = wakeup_alias(using)
        self.event = event
        self.mode = WakeupMode.STARTING
        self.decided = threading.Event()  # set once the first probe has an answer
        # Called from this thread when the mode changed: the runner's row shows it.
        self.on_mode_change = on_mode_change
        # Runs a function on another thread's connection of ``using`` (the runner's journal
        # writers): the probe and on_mode_change then hold no connection of this thread's
        # beyond the LISTEN's. Without it, they use one of this thread's, closed after.
        self.run_db = run_db
        # Called from this thread with (id, kind) of a row inserted alone, before the
        # event is set: the runner can claim that row by id (see parse_new_work). It
        # answers whether the runner takes such a row: if not, the event is not set.
        self.on_new_work = on_new_work
        # Called (this thread) with the kind an ended attempt's NOTIFY names; answers the same.
        self.on_kind_ended = on_kind_ended
        # Called (this thread) for a wake-up naming no row: many rows, a revive, a release.
        self.on_any_work = on_any_work
        self._stopping = threading.Event()
        self._reported_lost = False
        # Whether this outage's failed connects were reported (the first only: they are
        # retried every few seconds for as long as it lasts).
        self._reported_unreachable = False
        # Whether the runner waits for NOTIFYs (set by the runner's thread), and whether
        # this session holds the waiting lock that makes enqueues send them (this thread).
        self._waiting = False
        self.holds_waiting_lock = False
        # The rest locks of the limited kinds the runner rests (this thread holds them).
        self.on_rest_held = on_rest_held
        self.rest_locks = RestLocks(self._rest_held)
        # Rung by the runner's thread so that this one, asleep in select(), acts at once.
        self._bell, self._bell_rope = socket.socketpair()
        # Seconds between statements that keep an idle session alive (see _connect).
        self._keep_alive_every: float | None = None

    def stop(self) -> None:
        """Stop listening (from the calling thread)."""
        self._stopping.set()
        self._ring()
        if self.is_alive():
            self.join(2.0)  # it notices at once (within LISTEN_TURN if busy)
        if not self.is_alive():
            self._bell.close()
            self._bell_rope.close()

    def wait_for_notifies(self, waiting: bool) -> None:
        """From the runner's thread: whether it is about to wait for new work (so enqueues
        must notify) or has a backlog (they need not). Takes effect on this thread."""
        if waiting != self._waiting:
            self._waiting = waiting
            self._ring()

    def rest_on(self, kinds: frozenset[str], ending: frozenset[str] = frozenset()) -> None:
        """From the runner's thread: the limited kinds it rests now (``ending``: until an
        attempt of theirs ends; :mod:`.rest_locks`)."""
        if self.rest_locks.want(kinds, ending):
            self._ring()

    def _rest_held(self, kind: str) -> None:
        """A rest lock is held: the runner asks the kind once more, now (see rest_locks)."""
        if self.on_rest_held is not None:
            self.on_rest_held(kind)
        self.event.set()

    def ready_to_wait(self) -> bool:
        """Whether a runner that waits now is woken by a NOTIFY when work arrives: wake-ups
        work and this session holds the waiting lock (from the runner's thread)."""
        return self.mode is WakeupMode.LISTENING and self.holds_waiting_lock

    def _ring(self) -> None:
        with contextlib.suppress(OSError):  # closed: the listener is gone
            self._bell_rope.send(b"\0")

    def _connect(self) -> Any:
        import psycopg

        params = dict(connections[self.listen_using].get_connection_params())
        for django_only in ("cursor_factory", "context"):
            params.pop(django_only, None)
        params["connect_timeout"] = params.get("connect_timeout") or 5
        params["prepare_threshold"] = None  # no server-side state beyond the LISTEN itself
        connection = psycopg.connect(**params, autocommit=True)
        postgresql.listen(connection, CHANNEL)
        # This session sits idle by design: where the server ends idle sessions, a
        # statement now and then keeps it (each reconnect would open a gap and log twice).
        timeout = postgresql.idle_session_timeout(connection)
        self._keep_alive_every = timeout / 2 if timeout is not None else None
        return connection

    def run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                connection = self._connect()
            except Exception as error:  # noqa: BLE001 - any failure means "retry later"
                if not self._reported_unreachable:  # once per outage; "arrive again" ends it
                    self._reported_unreachable = True
                    logger.warning(
                        "wake-up listener cannot connect to database %r (%s); polling every %gs until it can",
                        self.listen_using,
                        type(error).__name__,
                        app_settings.WAKEUP_FALLBACK_POLL_INTERVAL,
                    )
                self._set_mode(WakeupMode.SHORT_POLL)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            self._reported_unreachable = False
            # Work may have been enqueued while we were not listening.
            self.event.set()
            try:
                with connection:
                    self._listen(connection)
            except Exception as error:  # noqa: BLE001
                if not self._stopping.is_set():
                    logger.warning(
                        "wake-up listener lost its connection (%s); reconnecting",
                        type(error).__name__,
                    )
                    self._set_mode(WakeupMode.SHORT_POLL)
        self.decided.set()

    def _listen(self, connection: Any) -> None:
        next_probe = 0.0  # probe at once after every (re)connect
        next_keep_alive = self._next_keep_alive()
        try:
            while not self._stopping.is_set():
                if time.monotonic() >= next_keep_alive:
                    postgresql.keep_alive(connection)
                    next_keep_alive = self._next_keep_alive()
                if time.monotonic() >= next_probe:
                    arrived = self._probe(connection)
                    if arrived is None:  # the probe could not be sent: try again soon
                        next_probe = time.monotonic() + min(REPROBE_INTERVAL, 5.0)
                    else:
                        self._probe_answered(arrived)
                        next_probe = float("inf") if arrived else time.monotonic() + REPROBE_INTERVAL
                self._settle_waiting_lock(connection)
                self.rest_locks.settle(connection, listening=self.mode is WakeupMode.LISTENING)
                # Also those that arrived while a statement ran (psycopg keeps them).
                for notification in connection.notifies(timeout=0):
                    self._received(notification.payload)
                self._sleep(connection, until=next_keep_alive)
        finally:
            self.holds_waiting_lock = False  # the session's locks end with it
            self.rest_locks.lost()

    def _next_keep_alive(self) -> float:
        every = self._keep_alive_every
        return time.monotonic() + every if every is not None else float("inf")

    def _sleep(self, connection: Any, *, until: float) -> None:
        """Until a notification arrives, the runner rings, LISTEN_TURN passes or the next
        keep-alive is due (``until``): a wake-up just before it must not push it a turn
        later, past the server's idle timeout."""
        turn = max(0.0, min(LISTEN_TURN, until - time.monotonic()))
        readable, _, _ = select.select([connection.fileno(), self._bell], [], [], turn)
        if self._bell in readable:
            self._bell.recv(4096)

    def _settle_waiting_lock(self, connection: Any) -> None:
        """Hold the waiting lock while the runner waits and wake-ups work; not otherwise."""
        wanted = self._waiting and self.mode is WakeupMode.LISTENING
        if wanted == self.holds_waiting_lock:
            return
        if not wanted:
            postgresql.release_waiting_lock(connection)
            self.holds_waiting_lock = False
            return
        import psycopg

        try:
            postgresql.hold_waiting_lock(connection, lock_timeout=WAITING_LOCK_TIMEOUT)
        except psycopg.errors.LockNotAvailable:
            return  # an enqueue's transaction is still open: next turn (the runner polls)
        self.holds_waiting_lock = True
        # Enqueues that sent no NOTIFY have all ended: the runner claims once more.
        self._received("")

    def _received(self, payload: str) -> bool:
        """Handle one notification; True if it was a probe (ours or another runner's)."""
        if payload.startswith(PROBE_PREFIX):
            return True
        if self._for_this_runner(payload):
            self.event.set()
        return False

    def _for_this_runner(self, payload: str) -> bool:
        """Tell the runner what a wake-up names; whether it may find work to claim: a row or
        an ended attempt of a kind it does not run is no reason for a claim. A payload
        naming no row (many rows, a revive, a release, the waiting lock taken) always is."""
        ended = parse_ended(payload)
        if ended is not None and self.on_kind_ended is not None:
            return self.on_kind_ended(ended)
        new_work = parse_new_work(payload)
        if new_work is not None:
            return self.on_new_work(*new_work) if self.on_new_work is not None else True
        if self.on_any_work is not None:  # (an ended attempt too, with no on_kind_ended)
            self.on_any_work()
        return True

    def _probe(self, connection: Any) -> bool | None:
        """Send a probe from the runner's own alias and wait for it on ``connection``:
        True if it arrived, False if not, None if it could not be sent."""
        payload = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            if self.run_db is not None:
                self.run_db(notify_probe, self.using, payload)
            else:
                send_probe(self.using, payload)
        except Exception as error:  # noqa: BLE001 - the database may be down: retry later
            logger.warning(
                "wake-up probe could not be sent through database %r (%s); retrying",
                self.using,
                type(error).__name__,
            )
            if self.mode is WakeupMode.STARTING:
                self._set_mode(WakeupMode.SHORT_POLL)
            return None
        deadline = time.monotonic() + PROBE_TIMEOUT
        while (remaining := deadline - time.monotonic()) > 0:
            for notification in connection.notifies(timeout=remaining):
                if notification.payload == payload:
                    return True
                self._received(notification.payload)
        return False

    def _probe_answered(self, arrived: bool) -> None:
        if arrived:
            if self.mode is WakeupMode.SHORT_POLL:
                logger.warning(
                    "wake-ups arrive again on database %r; polling every %gs again",
                    self.listen_using,
                    app_settings.POLL_INTERVAL,
                )
            self._reported_lost = False
            self._set_mode(WakeupMode.LISTENING)
        else:
            if not self._reported_lost:
                logger.warning(self._lost_message())
                self._reported_lost = True
            self._set_mode(WakeupMode.SHORT_POLL)

    def _lost_message(self) -> str:
        if app_settings.WAKEUP_DATABASE:
            cause = (
                f"a NOTIFY sent through database {self.using!r} did not reach the LISTEN on "
                f"WAKEUP_DATABASE {self.listen_using!r} within {PROBE_TIMEOUT:g}s: does that "
                "alias connect straight to the same PostgreSQL database?"
            )
        else:
            cause = (
                f"a NOTIFY sent through database {self.using!r} did not reach this runner's "
                f"LISTEN within {PROBE_TIMEOUT:g}s. LISTEN is session state, and a connection "
                "pooler in transaction mode (PgBouncer's pool_mode = transaction) drops it: set "
                "NEXUS_WORKFLOWS['WAKEUP_DATABASE'] to a database alias that connects straight "
                "to PostgreSQL"
            )
        return (
            f"wake-ups do not arrive: {cause}. Until they do, this runner polls every "
            f"{app_settings.WAKEUP_FALLBACK_POLL_INTERVAL:g}s (WAKEUP_FALLBACK_POLL_INTERVAL) "
            "and probes again every "
            f"{REPROBE_INTERVAL:g}s"
        )

    def _set_mode(self, mode: WakeupMode) -> None:
        changed = mode is not self.mode
        self.mode = mode
        if mode is not WakeupMode.STARTING:
            self.decided.set()
        if changed:
            self.event.set()  # the runner re-reads its poll interval
            if self.on_mode_change is not None and not self._stopping.is_set():
                self._show_mode(self.on_mode_change)

    def _show_mode(self, show: Callable[[], None]) -> None:
        try:
            if self.run_db is not None:
                self.run_db(show)
            else:
                try:
                    show()
                finally:
                    with contextlib.suppress(Exception):
                        connections[self.using].close()  # hold no second connection
        except Exception as error:  # noqa: BLE001 - the row is only shown
            logger.debug("runner row not updated (%s)", type(error).__name__)


def send_probe(using: str, payload: str) -> None:
    """:func:`notify_probe` on this thread's connection of ``using``, closed afterwards so
    an idle listener holds no second connection."""
    try:
        notify_probe(using, payload)
    finally:
        connections[using].close()


def notify_probe(using: str, payload: str) -> None:
    """NOTIFY ``payload`` on this thread's connection of ``using``."""
    with connections[using].cursor() as cursor:
        postgresql.notify(cursor, CHANNEL, payload)
