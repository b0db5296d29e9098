"""How attempts are numbered wherever a person reads them: logs, the CLI, the admin, signals.

The ``attempt`` column counts failed and lost attempts (0 for work that never failed); people
read "attempt 1 of 3" for the first run. Every place that shows an attempt goes through here.
"""

from __future__ import annotations

from nexus_workflows.deferred.registry import registry


def max_attempts(kind: str, backend_name: str = "") -> int | None:
    """Runs allowed for a kind, or ``None`` when this project does not register it. A
    Django task's row (``backend_name`` set, the kind an import path) is allowed what its
    task's schedule says, where the task can be loaded."""
    if backend_name and "." in kind:
        return registry.task_max_attempts(kind, backend_name)
    if kind not in registry:
        return None
    return registry.get(kind).max_attempts


def attempt_number(kind: str, attempt: int, backend_name: str = "") -> int:
    """The number (from 1) of the attempt that runs next, runs now, or ran last.

    Work abandoned because its runners kept dying has ``attempt`` equal to the runs
    allowed, all of them lost, hence the cap.
    """
    return number_of(attempt, max_attempts(kind, backend_name))


def number_of(attempt: int, allowed: int | None) -> int:
    """:func:`attempt_number` when the runs allowed are known already."""
    return min(attempt + 1, allowed) if allowed else attempt + 1


def describe_attempt(kind: str, attempt: int, backend_name: str = "") -> str:
    """``"attempt 2 of 3"`` (``"attempt 2"`` for a kind this project does not register)."""
    allowed = max_attempts(kind, backend_name)
    return attempt_text(number_of(attempt, allowed), allowed)


def attempt_text(number: int, allowed: int | None) -> str:
    """:func:`describe_attempt` when the number and the runs allowed are known already."""
    return f"attempt {number} of {allowed}" if allowed else f"attempt {number}"
