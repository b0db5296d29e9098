"""Django signals for deferred work, for projects that count, trace or alert on it.

Every signal is sent with ``sender=DeferredWork`` and these keyword arguments:

* ``kind``: the workflow's kind;
* ``id``: the work's primary key (an ``int``);
* ``attempt``: the attempt's number from 1, as the logs, the CLI and the admin show it
  (for ``work_enqueued`` and ``work_revived``: the attempt that runs next).

``attempt_finished`` adds ``outcome`` (``"done"``, ``"rescheduled"``, ``"abandoned"``,
``"lost"`` or ``"released"``) and ``duration`` (seconds ``prepare`` ran, a ``float``).
No signal carries the trigger, the checkpoints, the dedupe key or an error message: they
may hold patient data.

Receivers run in the thread that sends: ``attempt_started`` in the runner's worker thread
just before ``prepare``, the others where the state change was written. A receiver that
raises is logged (its exception's type only) and changes nothing else: the runner and the
caller of ``enqueue`` carry on. With no receiver connected, sending costs one attribute
check. ``work_enqueued`` and ``work_revived`` are sent inside the caller's transaction when
there is one (as ``post_save`` is): receivers that reach outside the database belong in
``transaction.on_commit``.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from django.dispatch import Signal

from nexus_workflows.redaction import raised_at

logger = logging.getLogger(__name__)

# send_robust() logs a receiver's exception itself, message and traceback included, on
# "django.dispatch"; the message may quote patient data, so while send_quietly() sends,
# that record is dropped and the type and the place are logged instead. A context
# variable, not a thread-local: send_robust awaits async receivers through
# async_to_sync, in another thread that runs with a copy of the sender's context.
_sending: contextvars.ContextVar[bool] = contextvars.ContextVar("nexus_workflows_sending", default=False)


class _DropWhileSending(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _sending.get()


logging.getLogger("django.dispatch").addFilter(_DropWhileSending())

#: New work was inserted by ``enqueue``/``enqueue_many`` (not sent for a key already pending).
work_enqueued = Signal()
#: A runner is about to call ``prepare`` for one attempt.
attempt_started = Signal()
#: An attempt ended and its outcome was written (``outcome``, ``duration``).
attempt_finished = Signal()
#: Work was abandoned: a permanent error, its retry schedule used up, or its runners kept dying.
work_abandoned = Signal()
#: Abandoned work was made pending again (by ``enqueue``, the admin or ``workflows revive``).
work_revived = Signal()


def send(signal: Signal, *, kind: str, id: int, attempt: int, in_runner: bool = False, **extra: Any) -> None:
    """Send ``signal`` robustly; a receiver's exception is logged by type, never raised.
    ``in_runner``: sent by a runner, which a receiver's ``SystemExit`` must not end either."""
    if not signal.receivers:  # the hot path: nothing connected, nothing built
        return
    from nexus_workflows.models import DeferredWork

    about = f"{kind} #{id}"
    kwargs = {"kind": kind, "id": int(id), "attempt": attempt, **extra}
    send_quietly(signal, DeferredWork, _name(signal), about, contain_exits=in_runner, **kwargs)


def send_quietly(
    signal: Signal, sender: Any, name: str, about: str, *, contain_exits: bool = False, **kwargs: Any
) -> list[Any]:
    """``signal.send_robust(sender, **kwargs)`` with each failing receiver logged here by
    its exception's type and place only, never by Django (which logs the message and the
    traceback). ``name`` (the signal) and ``about`` (what it was sent for) go into that
    line and must not hold patient data. Returns send_robust's responses.

    send_robust lets a receiver's ``SystemExit`` and ``KeyboardInterrupt`` through. With
    ``contain_exits`` (a runner's sends) they are logged by type too, and the receivers
    after that one are not called; elsewhere (a web process ending its worker, Ctrl-C in
    a shell) they go on, as they must."""
    token = _sending.set(True)
    try:
        responses = signal.send_robust(sender, **kwargs)
    except (SystemExit, KeyboardInterrupt) as error:
        if not contain_exits:
            raise
        logger.error(
            "a receiver of %s raised %s for %s; ignored, and the receivers after it were not called",
            name,
            type(error).__name__,
            about,
        )
        return []
    finally:
        _sending.reset(token)
    for receiver, response in responses:
        if isinstance(response, Exception):
            # The type and where it was raised: the message may quote the data it choked on.
            logger.error(
                "a receiver of %s raised %s for %s; ignored (%s)",
                name,
                type(response).__name__,
                about,
                _where(receiver, response),
            )
    return responses


def _where(receiver: Any, error: BaseException) -> str:
    name = getattr(receiver, "__qualname__", type(receiver).__name__)
    return f"{name}, {raised_at(error)}" if error.__traceback__ else name


def has_receivers(signal: Signal) -> bool:
    return bool(signal.receivers)


def _name(signal: Signal) -> str:
    for name in ("work_enqueued", "attempt_started", "attempt_finished", "work_abandoned", "work_revived"):
        if globals()[name] is signal:
            return name
    return "a signal"
