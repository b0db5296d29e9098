"""When a resting serial-key kind's row can start: how long after that a busy runner claims it.

    .venv/bin/python benchmarks/serial_rest_ends.py [--rounds 20] [--scenario delayed|window]

In-process, like ``serial_held_turns.py``: a busy runner's flow claim
(``flow.claiming.FlowClaimer.claim_due``) is called every 2 ms, as a busy runner's turns
come. Each round:

* ``delayed``: key ``a`` runs a row and has another due behind it (the kind rests: every
  due row waits behind a busy key); a row of the free key ``b`` is enqueued with a delay
  of 50 to 150 ms. Nothing announces it coming due. Measured: claim time less its due time.
* ``window``: a ``serial_key`` kind with ``rate_limit=(1, 0.3)`` per key (``rate_key``
  the same key): key ``a``'s one start of the period was just taken and ended, its next
  row is due (the kind rests on the full window). Measured: claim time less the moment
  the window frees (the start's stamp + period + 25 ms).

Prints the median and largest delay. A measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.deferred_throughput import DEFAULT_DATABASE_URL, ensure_postgres_database  # noqa: E402

TURN = 0.002


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scenario", choices=("delayed", "window"), default="delayed")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def claim_until(flow: Any, claimer: Any, works: list[Any], deadline: float) -> float | None:
    """Turn every TURN until a row is claimed; the monotonic time it was, or None."""
    while time.monotonic() < deadline:
        flow.claim_due(claimer, 10, None, 10, works)
        if works:
            return time.monotonic()
        time.sleep(TURN)
    return None


def delayed_round(kind: str, number: int) -> float | None:
    from nexus_workflows import enqueue
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.flow.claiming import FlowClaimer
    from nexus_workflows.models import DeferredWork

    holder_claimer = Claimer(kinds=[kind], using="default", worker_id="holder")
    enqueue(kind, {"n": f"{number}-a1", "key": f"a{number}"})
    held: list[Any] = []
    FlowClaimer.for_kinds([kind], "default").claim_due(holder_claimer, 1, None, 1, held)  # type: ignore[union-attr]
    enqueue(kind, {"n": f"{number}-a2", "key": f"a{number}"})
    flow = FlowClaimer.for_kinds([kind], "default")
    assert flow is not None
    claimer = Claimer(kinds=[kind], using="default", worker_id="resting")
    works: list[Any] = []
    flow.claim_due(claimer, 10, None, 10, works)  # every due row behind key a: it rests
    assert not works
    delay = random.uniform(0.05, 0.15)
    enqueued = time.monotonic()
    enqueue(kind, {"n": f"{number}-b1", "key": f"b{number}"}, delay=delay)
    flow.wake(kind)  # as the enqueue's NOTIFY does (the runner rests the kind: its rest lock)
    claimed = claim_until(flow, claimer, works, enqueued + delay + 2.0)
    transitions.finish_done(held + works)
    DeferredWork.objects.filter(kind=kind).delete()  # key a's second row would start next round
    return None if claimed is None else claimed - (enqueued + delay)


def window_round(kind: str, number: int, period: float) -> float | None:
    from nexus_workflows import enqueue
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.flow import starts
    from nexus_workflows.flow.claiming import FlowClaimer

    claimer = Claimer(kinds=[kind], using="default", worker_id="resting")
    flow = FlowClaimer.for_kinds([kind], "default")
    assert flow is not None
    enqueue(kind, {"n": f"{number}-a1", "key": f"a{number}"})
    first: list[Any] = []
    flow.claim_due(claimer, 10, None, 10, first)
    assert len(first) == 1
    starts.begin(first[0])
    started = time.monotonic()
    transitions.finish_done(first)
    enqueue(kind, {"n": f"{number}-a2", "key": f"a{number}"})
    works: list[Any] = []
    claimed = claim_until(flow, claimer, works, started + period + 2.0)
    transitions.finish_done(works)
    return None if claimed is None else claimed - (started + period + 0.025)


def setup(args: argparse.Namespace) -> str:
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command

    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.models import DeferredWork, FlowWindowSlot

    call_command("migrate", verbosity=0)
    kind = f"bench-serial-rest-{args.scenario}"
    DeferredWork.objects.filter(kind=kind).delete()
    FlowWindowSlot.objects.filter(name=f"workflow:{kind}").delete()
    limits: dict[str, Any] = {"serial_key": lambda t: str(t["key"])}
    if args.scenario == "window":
        limits.update(rate_limit=(1, 0.3), rate_key=lambda t: str(t["key"]))
    registry.register(kind, dedupe_key=lambda t: str(t["n"]), prepare=noop, retry_schedule=[1], **limits)
    return kind


def main() -> None:
    args = parse_args()
    kind = setup(args)
    from nexus_workflows.models import DeferredWork

    delays: list[float] = []
    missed = 0
    for number in range(args.rounds):
        delay = delayed_round(kind, number) if args.scenario == "delayed" else window_round(kind, number, 0.3)
        if delay is None:
            missed += 1
        else:
            delays.append(delay * 1000)
    DeferredWork.objects.filter(kind=kind).delete()
    median, largest = statistics.median(delays), max(delays)
    missing = f", {missed} not claimed within 2 s" if missed else ""
    print(
        f"{args.scenario}: claimed a median {median:.1f} ms (largest {largest:.1f} ms) after it "
        f"could start, {len(delays)} rounds{missing}"
    )


if __name__ == "__main__":
    main()
