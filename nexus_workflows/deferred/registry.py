"""The workflow registry: which kinds exist, how to key them and what they run.

Workflows are registered at import time, usually from a ``workflows`` module of an
installed app, which :class:`~nexus_workflows.apps.NexusWorkflowsConfig` imports at
start-up the way the admin imports ``admin.py``.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.utils.module_loading import autodiscover_modules

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.unloadable import RecentlyUnloadable
from nexus_workflows.exceptions import AlreadyRegistered, RegistrationError, UnknownWorkflow
from nexus_workflows.flow.options import OPTION_NAMES, FlowLimits, KeyFunction, build_flow_limits
from nexus_workflows.limits import KIND_MAX_LENGTH, MAX_DELAY
from nexus_workflows.numbers import is_finite, is_seconds
from nexus_workflows.redaction import describe

if TYPE_CHECKING:
    from nexus_workflows.deferred.transitions import ClaimedWork

# A kind becomes part of an RQ job id (``<kind>__<dedupe key>``), which RQ limits to
# letters, digits, '_' and '-'; '__' is the separator, so a kind may not contain it.
KIND_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# The longest wait of a retry schedule, whatever RETENTION says: as any delay's.
_MAX_MINUTES = MAX_DELAY.total_seconds() / 60

DedupeKeyFunction = Callable[[Any], str]
PrepareFunction = Callable[..., Any]


@dataclass(frozen=True)
class Workflow:
    """A registered workflow. Deferred when it has a retry schedule, else fire-and-forget."""

    kind: str
    dedupe_key: DedupeKeyFunction
    prepare: PrepareFunction
    retry_schedule: tuple[float, ...] | None = None
    # Flow control (concurrency, serial key, rate limit); None for an unlimited kind.
    flow: FlowLimits | None = None
    # A Django task's adapter (nexus_workflows.tasks.running.TaskWorkflow) runs through
    # run_task(work) instead of prepare.
    runs_task: ClassVar[bool] = False

    @property
    def is_deferred(self) -> bool:
        return self.retry_schedule is not None

    @functools.cached_property
    def is_async(self) -> bool:
        # Cached: the runner asks per item (its lane) and inspect's test costs ~10 calls;
        # prepare cannot change on a frozen workflow. (cached_property writes __dict__.)
        return iscoroutinefunction(self.prepare)

    @property
    def max_attempts(self) -> int:
        """Runs allowed for deferred work: the first one plus one per schedule entry."""
        return len(self.retry_schedule or ()) + 1

    def call_prepare(self, *args: Any) -> None:
        """Run ``prepare`` to completion from synchronous code, awaiting it if it is
        ``async def``. A plain function that returns an awaitable is an error: nothing
        would ever await it, and its work would silently not happen."""
        if self.is_async:
            async_to_sync(self.prepare)(*args)
            return
        result = self.prepare(*args)
        if result is not None and inspect.isawaitable(result):  # most return None: no test
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"prepare of {self.kind!r} returned an awaitable but is not an 'async def' "
                "function; declare it async (or mark it with "
                "asgiref.sync.markcoroutinefunction) so that it is awaited"
            )

    def delay_after(self, attempt: int) -> timedelta | None:
        """The wait before the next run after attempt ``attempt`` failed, or ``None``
        when the schedule is exhausted and the work must be abandoned."""
        schedule = self.retry_schedule or ()
        if attempt >= len(schedule):
            return None
        return timedelta(minutes=schedule[attempt])


def _describe_type(value: object) -> str:
    return type(value).__name__


def _validate_kind(kind: object) -> str:
    if not isinstance(kind, str) or not kind:
        raise RegistrationError(
            f"workflow kind must be a non-empty string; got {_describe_type(kind)}"
            + (" (empty)" if kind == "" else "")
        )
    if "__" in kind:
        raise RegistrationError(
            "a workflow kind must not contain '__': it separates the kind from the dedupe key "
            "in fire-and-forget job ids"
        )
    if len(kind) > KIND_MAX_LENGTH or not KIND_PATTERN.fullmatch(kind):
        raise RegistrationError(
            f"a workflow kind of {len(kind)} characters is not allowed: use at most "
            f"{KIND_MAX_LENGTH} letters, digits, '-' and '_', starting with a letter or digit"
        )
    return kind


def _accepts(function: Callable[..., Any], arguments: int) -> bool:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return True
    try:
        signature.bind(*([None] * arguments))
    except TypeError:
        return False
    return True


def _validate_schedule(kind: str, retry_schedule: object) -> tuple[float, ...] | None:
    if retry_schedule is None:
        return None
    if not isinstance(retry_schedule, list | tuple) or not retry_schedule:
        raise RegistrationError(
            f"workflow {kind!r}: retry_schedule must be a non-empty list of minutes "
            f"(or None for fire-and-forget); got {_describe_type(retry_schedule)}"
            + (" (empty)" if isinstance(retry_schedule, list | tuple) else "")
        )
    # A RETENTION that is no number of seconds is the system check's to report (E002):
    # compared with here, it raised TypeError from every command's start-up, check's too.
    retention = app_settings.RETENTION
    retention_minutes = retention / 60 if is_seconds(retention) else math.inf
    schedule: list[float] = []
    for index, minutes in enumerate(retry_schedule):
        if isinstance(minutes, bool) or not isinstance(minutes, int | float):
            raise RegistrationError(
                f"workflow {kind!r}: retry_schedule[{index}] must be a number of minutes; "
                f"got {_describe_type(minutes)}"
            )
        if not is_finite(minutes) or minutes <= 0:
            raise RegistrationError(
                f"workflow {kind!r}: retry_schedule[{index}] must be a finite number of "
                "minutes greater than zero; got "
                + ("a non-finite number" if not is_finite(minutes) else "zero or less")
            )
        if minutes > _MAX_MINUTES:
            raise RegistrationError(
                f"workflow {kind!r}: retry_schedule[{index}] must be at most "
                f"{_MAX_MINUTES:,.0f} minutes (ten years); got more"
            )
        if minutes >= retention_minutes:
            raise RegistrationError(
                f"workflow {kind!r}: retry_schedule[{index}] is not shorter than the retention "
                f"of {retention_minutes:g} minutes "
                "(NEXUS_WORKFLOWS['RETENTION']); the work would be purged before its retry"
            )
        schedule.append(float(minutes))
    return tuple(schedule)


class WorkflowRegistry:
    """Kinds mapped to their :class:`Workflow`; safe to use from several threads."""

    #: What runs a Django task's row (task path, backend alias -> workflow):
    #: ``nexus_workflows.tasks.running.task_workflow``, plugged in by the app's ``ready()``
    #: (the tasks package imports this module, so this module does not import it).
    task_adapter: Callable[[str, str], Workflow] | None = None

    def __init__(self) -> None:
        self._workflows: dict[str, Workflow] = {}
        self._lock = threading.Lock()
        self.unloadable_tasks = RecentlyUnloadable()

    def register(
        self,
        kind: str,
        *,
        dedupe_key: DedupeKeyFunction,
        prepare: PrepareFunction,
        retry_schedule: Sequence[float] | None = None,
        concurrency: int | None = None,
        serial_key: KeyFunction | None = None,
        ordered: bool = False,
        rate_limit: tuple[int, float] | None = None,
        rate_key: KeyFunction | None = None,
    ) -> Workflow:
        """Register a workflow and return it; raises :class:`RegistrationError`."""
        kind = _validate_kind(kind)
        if not callable(dedupe_key):
            raise RegistrationError(
                f"workflow {kind!r}: dedupe_key must be callable (a function of the trigger "
                f"returning a string); got {_describe_type(dedupe_key)}"
            )
        if not _accepts(dedupe_key, 1):
            raise RegistrationError(f"workflow {kind!r}: dedupe_key must accept one argument, the trigger")
        if iscoroutinefunction(dedupe_key):
            # enqueue calls it where it is (no event loop): it would return a coroutine.
            raise RegistrationError(
                f"workflow {kind!r}: dedupe_key must be a plain function, not async def (enqueue "
                "calls it synchronously)"
            )
        if not callable(prepare):
            raise RegistrationError(
                f"workflow {kind!r}: prepare must be callable; got {_describe_type(prepare)}"
            )
        schedule = _validate_schedule(kind, retry_schedule)
        if schedule is not None and not _accepts(prepare, 3):
            raise RegistrationError(
                f"workflow {kind!r}: a deferred workflow's prepare must accept (trigger, checkpoints, save)"
            )
        if schedule is None and not _accepts(prepare, 1):
            raise RegistrationError(
                f"workflow {kind!r}: a fire-and-forget workflow's prepare must accept (trigger)"
            )
        flow = build_flow_limits(
            kind,
            deferred=schedule is not None,
            concurrency=concurrency,
            serial_key=serial_key,
            ordered=ordered,
            rate_limit=rate_limit,
            rate_key=rate_key,
        )
        workflow = Workflow(kind, dedupe_key, prepare, schedule, flow)
        with self._lock:
            if kind in self._workflows:
                raise AlreadyRegistered(f"workflow {kind!r} is already registered")
            self._workflows[kind] = workflow
        return workflow

    def unregister(self, kind: str) -> None:
        """Forget a kind (meant for tests); unknown kinds are ignored."""
        with self._lock:
            self._workflows.pop(kind, None)

    def get(self, kind: str) -> Workflow:
        try:
            return self._workflows[kind]
        except (KeyError, TypeError):
            # The kind given is not echoed: a caller may pass anything in its place.
            raise UnknownWorkflow(
                f"no workflow is registered for the kind given ({describe(kind)}); registered "
                f"kinds: {', '.join(sorted(self._workflows)) or 'none'}"
            ) from None

    def for_work(self, work: ClaimedWork) -> Workflow:
        """What runs claimed work: its registered workflow, or for a Django task's row
        (its kind is an import path) the task's adapter, which never raises here."""
        if work.is_task:
            if self.task_adapter is None:
                raise UnknownWorkflow(
                    f"{work.kind!r:.120} is a Django task's row, and Django tasks are run only once "
                    "the nexus_workflows app is ready (it plugs in nexus_workflows.tasks)"
                )
            return self.task_adapter(work.kind, work.columns.get("backend_name", ""))
        try:
            return self._workflows[work.kind]
        except KeyError:
            # A stored row's kind was registered where it was enqueued: naming it is safe.
            raise UnknownWorkflow(
                f"no workflow is registered for kind {work.kind!r:.120} in this process; "
                f"registered kinds: {', '.join(sorted(self._workflows)) or 'none'}"
            ) from None

    def task_max_attempts(self, path: str, backend_alias: str) -> int | None:
        """Runs a Django task enqueued on ``backend_alias`` is allowed (its own
        ``retry_schedule`` or its backend's), or None where it cannot be loaded. A task
        that could not be loaded is not tried again for :data:`.unloadable.RECHECK_AFTER`
        seconds (loaded ones are cached by the adapter): a page of its rows, or a log
        line per attempt, would otherwise try to import it once per row."""
        if self.task_adapter is None or (path, backend_alias) in self.unloadable_tasks:
            return None
        workflow = self.task_adapter(path, backend_alias)
        if getattr(workflow, "loaded", True):
            return workflow.max_attempts
        self.unloadable_tasks.remember((path, backend_alias))
        return None

    def task_loads(self, path: str, backend_alias: str) -> bool:
        """Whether the Django task ``path`` enqueued on ``backend_alias`` loads here (a
        failure is remembered for :data:`.unloadable.RECHECK_AFTER` seconds, as above)."""
        return self.task_max_attempts(path, backend_alias) is not None

    def __contains__(self, kind: object) -> bool:
        return kind in self._workflows

    def __iter__(self) -> Iterator[Workflow]:
        return iter(list(self._workflows.values()))

    def kinds(self, *, deferred: bool | None = None) -> list[str]:
        return sorted(
            workflow.kind for workflow in self if deferred is None or workflow.is_deferred == deferred
        )


registry = WorkflowRegistry()


def register(
    kind: str,
    *,
    dedupe_key: DedupeKeyFunction,
    prepare: PrepareFunction,
    retry_schedule: Sequence[float] | None = None,
    concurrency: int | None = None,
    serial_key: KeyFunction | None = None,
    ordered: bool = False,
    rate_limit: tuple[int, float] | None = None,
    rate_key: KeyFunction | None = None,
) -> Workflow:
    """Register a workflow. With ``retry_schedule`` (minutes) it is deferred and durable;
    without, it is fire-and-forget on django-rq.

    Deferred workflows may limit how their attempts start, across every runner of the
    database (see the README's "Flow control"): ``concurrency`` (attempts running at
    once), ``serial_key`` (a function of the trigger; equal keys run one at a time,
    earliest enqueued first), ``ordered`` (with ``serial_key``: an item waits for every
    earlier item of its key), ``rate_limit`` (``(limit, period_seconds)``: starts per
    sliding window) and ``rate_key`` (a function of the trigger giving each key its own
    rate limit).
    """
    return registry.register(
        kind,
        dedupe_key=dedupe_key,
        prepare=prepare,
        retry_schedule=retry_schedule,
        concurrency=concurrency,
        serial_key=serial_key,
        ordered=ordered,
        rate_limit=rate_limit,
        rate_key=rate_key,
    )


def workflow(
    kind: str,
    *,
    dedupe_key: DedupeKeyFunction,
    retry_schedule: Sequence[float] | None = None,
    **flow: Any,
) -> Callable[[PrepareFunction], PrepareFunction]:
    """Decorator form of :func:`register`; the decorated function is ``prepare``::

        @workflow("send-summary", dedupe_key=lambda t: str(t["visit_id"]), retry_schedule=[5, 30])
        def send_summary(trigger, checkpoints, save): ...

    The function is returned unchanged, so it can still be called directly in tests.
    Flow-control options (``concurrency``, ``serial_key``, ``ordered``, ``rate_limit``,
    ``rate_key``) are passed on to :func:`register`.
    """

    unknown = sorted(str(name) for name in flow if name not in OPTION_NAMES)
    if unknown:  # a misspelt option would otherwise be a bare TypeError of register()
        raise RegistrationError(
            f"workflow {kind!r}: unknown option {', '.join(map(repr, unknown))}; the options are "
            f"dedupe_key, retry_schedule, {', '.join(OPTION_NAMES)}"
        )

    def decorator(prepare: PrepareFunction) -> PrepareFunction:
        register(kind, dedupe_key=dedupe_key, prepare=prepare, retry_schedule=retry_schedule, **flow)
        return prepare

    return decorator


def autodiscover() -> None:
    """Import the ``workflows`` module of every installed app."""
    autodiscover_modules("workflows")
