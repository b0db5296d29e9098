"""nexus_workflows side by side with django-tasks-db and Procrastinate, and how its cost grows.

Run it through ``benchmarks/compare``, which first installs the peers into their own virtualenv.
Prints a Markdown report (and writes it, with the raw figures as JSON, under ``var/``).
Nothing here asserts a speed: targets are reported as met or missed, with the margin.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.children import die_with_parent  # noqa: E402

SYSTEMS = ("ours", "django-tasks", "procrastinate")
SECTIONS = ("compare", "scaling", "growth", "purge", "limit", "io", "pgbouncer")
DEFAULT_SECTIONS = SECTIONS[:-1]  # pgbouncer: with --via-pgbouncer (or --sections pgbouncer)
# Behind PgBouncer (transaction pooling), beside direct runs of the same systems.
VARIANTS = {
    "ours-direct": ("ours", "direct", "nexus_workflows, direct"),
    "ours-pooled": ("ours", "pooled", "nexus_workflows via PgBouncer"),
    "ours-pooled-wakeup": ("ours", "pooled+wakeup", "nexus_workflows via PgBouncer, WAKEUP_DATABASE direct"),
    "procrastinate-direct": ("procrastinate", "direct", "Procrastinate, direct"),
    "procrastinate-pooled": ("procrastinate", "pooled", "Procrastinate via PgBouncer"),
}
# The same @task module (benchmarks/tasks.py) on our Tasks backend and on django-tasks-db's.
TASK_SYSTEMS = ("ours-tasks", "django-tasks")
RUN_ORDER = ("ours", "ours-tasks", "django-tasks", "procrastinate")
LABELS = {
    "ours": "nexus_workflows",
    "ours-tasks": "nexus_workflows.tasks.DeferredBackend",
    "django-tasks": "django-tasks-db",
    "procrastinate": "Procrastinate",
}

# The targets.
TARGET_DRAIN = 2000
TARGET_PEER_MULTIPLE = 4
TARGET_ENQUEUE = 1500
TARGET_BULK = 20_000
TARGET_LATENCY_MS = 5
TARGET_GROWTH = 0.20
TARGET_STALL_MS = 1000
TARGET_POOLED_LATENCY_MULTIPLE = 1.5  # with WAKEUP_DATABASE, of the direct latency
TARGET_POOLED_DRAIN = 0.80  # of the direct drain
# Issue 13: Django's Tasks API on our runner against django-tasks-db, same @task module.
TARGET_TASKS_DRAIN_MULTIPLE = 20
TARGET_TASKS_LATENCY_DIVISOR = 50
# Issue 12: the idle wake-up against Procrastinate's, the no-op drain against the better peer,
# a single enqueue against the raw INSERT transaction rate (the limit section).
TARGET_IO_LATENCY_DIVISOR = 2
TARGET_IO_DRAIN_MULTIPLE = 20
TARGET_IO_ENQUEUE_OF_INSERT = 0.70
# Issue 12: jobs that wait 200 ms (benchmarks/io_workload.py).
IO_CONCURRENCY = (4, 32, 128, 512)
IO_JOBS = (1000, 5000)
# --io-reduced: one job count per concurrency, about 5 s of ideal work or less each, and
# the 5,000 jobs at 512 the targets are about.
IO_REDUCED_JOBS = {4: 100, 32: 800, 128: 1000, 512: 5000}
# (system, mode, one save() per job)
IO_VARIANTS = (
    ("ours", "sync", False),
    ("ours", "sync", True),
    ("ours", "async", False),
    ("ours", "async", True),
    ("procrastinate", "sync", False),
    ("procrastinate", "async", False),
)
TARGET_IO_ASYNC_OF_IDEAL = 0.80
TARGET_IO_CONNECTIONS = 10
TARGET_IO_THREADS = 64
TARGET_IO_PEER_MULTIPLE = 2
TARGET_IO_SYNC_SAVE_OF_IDEAL = 0.80


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=5000, help="jobs per run and system (default 5000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system, alternating (default 3)")
    parser.add_argument("--latency-samples", type=int, default=30)
    parser.add_argument(
        "--procrastinate-concurrency",
        type=int,
        default=1,
        help="the Procrastinate worker's --concurrency (default 1, its own default)",
    )
    parser.add_argument("--scaling-items", type=int, default=10_000)
    parser.add_argument("--growth-sizes", type=int, nargs="+", default=[0, 100_000, 1_000_000])
    parser.add_argument("--purge-expired", type=int, default=1_000_000)
    parser.add_argument("--purge-backlog", type=int, default=300_000)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS))
    parser.add_argument(
        "--io-reduced",
        action="store_true",
        help="io section: one job count per concurrency (4: 100, 32: 800, 128: 1000, 512: 5000) "
        "instead of 1,000 and 5,000 at each: a few minutes instead of about an hour",
    )
    parser.add_argument(
        "--via-pgbouncer",
        action="store_true",
        help="also run ours and Procrastinate through a private PgBouncer in transaction mode "
        "(Debian's pgbouncer), beside direct runs: the pgbouncer section",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432"),
        help="server to use; databases nw_cmp_* are created on it",
    )
    parser.add_argument(
        "--database-prefix",
        default="nw_cmp",
        help="prefix of the databases created (default nw_cmp), so that runs sharing a server stay apart",
    )
    parser.add_argument("--peers-python", default=str(ROOT / "benchmarks/.peers-venv/bin/python"))
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        metavar="LOAD",
        help="first wait (up to --wait-max seconds) until the 1-minute load average is below LOAD",
    )
    parser.add_argument("--wait-max", type=float, default=1200)
    options = parser.parse_args()
    if options.via_pgbouncer and "pgbouncer" not in options.sections:
        options.sections.append("pgbouncer")
    return options


# --- Environment ----------------------------------------------------------------------------


def ensure_database(server: str, name: str) -> str:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return f"{server}/{name}"


def machine(server: str) -> dict[str, Any]:
    import psycopg

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    memory_kb = next(
        (int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")), 0
    )
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        postgres = {
            name: connection.execute(f"SHOW {name}").fetchone()[0]
            for name in ("server_version", "synchronous_commit", "fsync", "autovacuum", "shared_buffers")
        }
    return {
        "cores": os.cpu_count(),
        "cpu_model": models[0] if models else platform.processor(),
        "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "postgres": postgres,
    }


def user_arguments() -> list[str]:
    """The command line as the user typed it (without what benchmarks/compare adds)."""
    arguments, skip = [], False
    for argument in sys.argv[1:]:
        if skip or argument == "--peers-python":
            skip = not skip
            continue
        arguments.append(argument)
    return arguments


def wait_for_quiet(threshold: float, longest: float) -> None:
    deadline = time.monotonic() + longest
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        log(f"load average {os.getloadavg()[0]:.2f} >= {threshold}; waiting")
        time.sleep(60)


def run_json(args: Sequence[str]) -> dict[str, Any]:
    """Run a measuring script; its stderr passes through, its last stdout line is the JSON."""
    completed = subprocess.run(
        list(args), cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False, preexec_fn=die_with_parent()
    )
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed with {completed.returncode}:\n{completed.stdout[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


# --- Formatting -----------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = ",.0f") -> str:
    """Median (min-max)."""
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(met: bool, detail: str) -> str:
    return ("met" if met else "**missed**") + f" ({detail})"


# --- Sections -------------------------------------------------------------------------------


def run_compare(options: argparse.Namespace, urls: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in RUN_ORDER}
    for run in range(options.runs):
        # Alternate: each run starts with the next system, so no system always goes first.
        order = RUN_ORDER[run % len(RUN_ORDER) :] + RUN_ORDER[: run % len(RUN_ORDER)]
        for system in order:
            python = sys.executable if system.startswith("ours") else options.peers_python
            log(f"run {run + 1}/{options.runs}: {system}")
            runs[system].append(
                run_json(
                    [
                        python,
                        "benchmarks/run_system.py",
                        system,
                        "--database-url",
                        urls[system],
                        "--items",
                        str(options.items),
                        "--latency-samples",
                        str(options.latency_samples),
                        "--procrastinate-concurrency",
                        str(options.procrastinate_concurrency),
                    ]
                )
            )
    return runs


def report_compare(
    runs: dict[str, list[dict[str, Any]]], options: argparse.Namespace
) -> tuple[str, list[str]]:
    def values(system: str, key: str) -> list[float]:
        return [run[key] for run in runs[system] if key in run]

    def ratios(peer: str, key: str, *, inverse: bool = False) -> list[float]:
        pairs = zip(runs["ours"], runs[peer], strict=True)
        return [
            (p[key] / o[key]) if inverse else (o[key] / p[key]) for o, p in pairs if key in o and key in p
        ]

    rows = [
        ["enqueue one by one (/s)", *(spread(values(s, "enqueue_per_s")) for s in SYSTEMS)],
        [
            "bulk enqueue (/s)",
            spread(values("ours", "bulk_enqueue_per_s")) + " `enqueue_many`",
            "no bulk API",
            spread(values("procrastinate", "bulk_enqueue_per_s")) + " `batch_defer`",
        ],
        ["drain, 1 worker process (/s)", *(spread(values(s, "drain_per_s")) for s in SYSTEMS)],
        [
            "idle enqueue-to-start latency, median (ms)",
            *(spread(values(s, "latency_median_ms"), ",.1f") for s in SYSTEMS),
        ],
        [
            "… of which the enqueue call itself (ms)",
            *(spread(values(s, "latency_enqueue_median_ms"), ",.1f") for s in SYSTEMS),
        ],
        [
            "… of which from its return to the start (ms)",
            *(spread(values(s, "latency_pickup_median_ms"), ",.1f") for s in SYSTEMS),
        ],
    ]
    lines = [table(["", *(LABELS[s] for s in SYSTEMS)], rows), ""]
    ratio_rows = []
    for peer in SYSTEMS[1:]:
        ratio_rows.append(
            [
                LABELS[peer],
                spread(ratios(peer, "enqueue_per_s"), ".2f") + "x",
                spread(ratios(peer, "drain_per_s"), ".1f") + "x",
                spread(ratios(peer, "latency_median_ms", inverse=True), ".1f") + "x",
                (spread(ratios(peer, "bulk_enqueue_per_s"), ".2f") + "x") if peer == "procrastinate" else "—",
            ]
        )
    lines += [
        "Ours relative to each peer, from the same run (median (min-max) over the runs; "
        "above 1x means ours is faster):",
        "",
        table(["peer", "enqueue", "drain", "idle latency (peer ÷ ours)", "bulk enqueue"], ratio_rows),
    ]
    drain = statistics.median(values("ours", "drain_per_s"))
    best_peer = max(statistics.median(values(p, "drain_per_s")) for p in SYSTEMS[1:])
    enqueue = statistics.median(values("ours", "enqueue_per_s"))
    bulk = statistics.median(values("ours", "bulk_enqueue_per_s"))
    latency = statistics.median(values("ours", "latency_median_ms"))
    targets = [
        f"drain ≥ {TARGET_DRAIN:,}/s with one process: "
        + verdict(drain >= TARGET_DRAIN, f"{drain:,.0f}/s, {drain / TARGET_DRAIN:.0%} of target"),
        f"drain ≥ {TARGET_PEER_MULTIPLE}x the better peer per process: "
        + verdict(drain >= TARGET_PEER_MULTIPLE * best_peer, f"{drain / best_peer:.1f}x"),
        f"enqueue ≥ {TARGET_ENQUEUE:,}/s one by one: "
        + verdict(enqueue >= TARGET_ENQUEUE, f"{enqueue:,.0f}/s, {enqueue / TARGET_ENQUEUE:.0%} of target"),
        f"`enqueue_many` ≥ {TARGET_BULK:,}/s: "
        + verdict(bulk >= TARGET_BULK, f"{bulk:,.0f}/s, {bulk / TARGET_BULK:.0%} of target"),
        f"idle latency median < {TARGET_LATENCY_MS} ms: "
        + verdict(latency < TARGET_LATENCY_MS, f"{latency:.1f} ms"),
        f"(#12) no-op drain ≥ {TARGET_IO_DRAIN_MULTIPLE}x the better peer: "
        + verdict(drain >= TARGET_IO_DRAIN_MULTIPLE * best_peer, f"{drain / best_peer:.1f}x"),
    ]
    if runs.get("procrastinate"):
        peer = statistics.median(values("procrastinate", "latency_median_ms"))
        pickup = statistics.median(values("ours", "latency_pickup_median_ms"))
        peer_pickup = statistics.median(values("procrastinate", "latency_pickup_median_ms"))
        targets.append(
            f"(#12) idle latency ≤ 1/{TARGET_IO_LATENCY_DIVISOR} of Procrastinate's: "
            + verdict(
                latency * TARGET_IO_LATENCY_DIVISOR <= peer,
                f"{latency:.1f} vs {peer:.1f} ms, 1/{peer / latency:.2f}; from the enqueue's return "
                f"to the start: {pickup:.1f} vs {peer_pickup:.1f} ms, 1/{peer_pickup / pickup:.2f}",
            )
        )
    return "\n".join(lines), targets


def report_tasks(runs: dict[str, list[dict[str, Any]]]) -> tuple[str, list[str]]:
    """The same @task module on our backend and on django-tasks-db's, from the same runs."""
    ours, peer = TASK_SYSTEMS

    def values(system: str, key: str) -> list[float]:
        return [run[key] for run in runs[system] if key in run]

    pairs = list(zip(runs[ours], runs[peer], strict=True))
    drain_ratios = [o["drain_per_s"] / p["drain_per_s"] for o, p in pairs]
    latency_ratios = [p["latency_median_ms"] / o["latency_median_ms"] for o, p in pairs]
    enqueue_ratios = [o["enqueue_per_s"] / p["enqueue_per_s"] for o, p in pairs]
    rows = [
        [
            "enqueue one by one, `Task.enqueue` (/s)",
            *(spread(values(s, "enqueue_per_s")) for s in TASK_SYSTEMS),
            spread(enqueue_ratios, ".2f") + "x",
        ],
        [
            "drain, 1 worker process (/s)",
            *(spread(values(s, "drain_per_s")) for s in TASK_SYSTEMS),
            spread(drain_ratios, ".1f") + "x",
        ],
        [
            "idle enqueue-to-start latency, median (ms)",
            *(spread(values(s, "latency_median_ms"), ",.1f") for s in TASK_SYSTEMS),
            spread(latency_ratios, ".1f") + "x (peer ÷ ours)",
        ],
    ]
    text = table(
        ["", "`runworkflows` (ours)", "`db_worker` (django-tasks-db)", "ours relative to django-tasks-db"],
        rows,
    )
    drain = statistics.median(drain_ratios)
    latency = statistics.median(latency_ratios)
    return text, [
        f"Tasks API drain ≥ {TARGET_TASKS_DRAIN_MULTIPLE}x django-tasks-db's: "
        + verdict(drain >= TARGET_TASKS_DRAIN_MULTIPLE, f"{drain:.1f}x"),
        f"Tasks API idle latency ≤ 1/{TARGET_TASKS_LATENCY_DIVISOR} of django-tasks-db's: "
        + verdict(latency >= TARGET_TASKS_LATENCY_DIVISOR, f"1/{latency:.0f}"),
    ]


def report_scaling(result: dict[str, Any]) -> str:
    one = statistics.median(result["drain_per_s"]["1"])
    rows = [
        [processes, spread(rates), f"{statistics.median(rates) / one:.2f}x"]
        for processes, rates in result["drain_per_s"].items()
    ]
    return table(["`runworkflows` processes", f"drain of {result['items']:,} (/s)", "vs 1 process"], rows)


def report_growth(result: dict[str, Any]) -> tuple[str, list[str]]:
    steps = result["steps"]
    empty = steps[0]["drain_per_s_median"]
    rows = []
    for step in steps:
        query = step["due_query"]
        rows.append(
            [
                f"{step['retained_done_rows']:,}",
                f"{step['table_mb']:,.0f} MB",
                f"{step.get('insert_seconds', 0):.1f} s + {step['vacuum_analyze_seconds']:.1f} s",
                f"{query['explain_execution_ms']:.3f} ms"
                + (" (nw_due_idx)" if query["uses_due_index"] else " (no index!)"),
                f"{query['orm_query_ms_median']:.2f} ms",
                spread([d["per_s"] for d in step["drains"]]),
                f"{step['drain_per_s_median'] / empty:.0%}",
            ]
        )
    worst = min(step["drain_per_s_median"] / empty for step in steps)
    text = table(
        [
            "retained done rows",
            "table + indexes",
            "setup (insert + VACUUM ANALYZE)",
            "due query (EXPLAIN ANALYZE)",
            "due query via the ORM",
            f"drain of {result['items']:,} (/s)",
            "vs empty",
        ],
        rows,
    )
    return text, [
        f"drain with up to {steps[-1]['retained_done_rows']:,} retained rows within 20% of the "
        "empty table: " + verdict(worst >= 1 - TARGET_GROWTH, f"worst {worst:.0%} of the empty-table rate")
    ]


def report_purge(result: dict[str, Any]) -> tuple[str, list[str]]:
    lines = [
        f"- {result['expired_rows']:,} expired done rows (inserted in "
        f"{result['insert_expired_seconds']:.1f} s), backlog of {result['backlog']:,} pending no-op "
        f"items; `PURGE_BATCH_SIZE` {result['purge_batch_size']:,}.",
        f"- Purge complete after **{result['purge_seconds']:.1f} s** while one runner drained "
        f"{result['drained_during_purge']:,} items ({result['drain_per_s_during_purge']:,.0f}/s); "
        f"backlog left at the end: {result['backlog_left_at_end']:,}.",
        f"- One purge batch timed alone ({result['timed_batches']} batches of "
        f"{result['purge_batch_size']:,} rows, no runner): median {result['purge_batch_ms_median']:.0f} ms, "
        f"longest {result['purge_batch_ms_max']:.0f} ms.",
        f"- Gaps between consecutive writes of finished work (one per turn of the runner's loop, purge batch "
        f"included), over {result['done_writes']:,} writes: median {result['median_gap_ms']:.0f} ms, "
        f"p99 {result['p99_gap_ms'] or float('nan'):.0f} ms, **longest {result['longest_gap_ms']:.0f} ms** "
        f"(five longest: {', '.join(f'{gap:.0f}' for gap in result['longest_gaps_ms'])} ms).",
    ]
    stalled = result["longest_gap_ms"]
    lasted = result["backlog_left_at_end"] > 0
    return "\n".join(lines), [
        "purge never blocks the runner for more than a second: "
        + verdict(
            stalled <= TARGET_STALL_MS and lasted,
            f"longest gap {stalled:.0f} ms"
            + ("" if lasted else "; the backlog ran out before the purge ended"),
        )
    ]


def report_limit(
    result: dict[str, Any], runs: dict[str, list[dict[str, Any]]] | None
) -> tuple[str, list[str]]:
    update = result["update_per_s"]
    targets: list[str] = []
    lines = [
        f"- Single-row `UPDATE` transactions, autocommit, one psycopg connection: **{update:,.0f}/s**; "
        f"`INSERT`: {result['insert_per_s']:,.0f}/s; `SELECT 1` round trips: "
        f"{result['select_1_per_s']:,.0f}/s.",
    ]
    if runs:
        ours = runs["ours"]
        drain = statistics.median(run["drain_per_s"] for run in ours)
        batch = statistics.median(run["items"] / run["done_batches"] for run in ours)
        writes = 2 / batch
        ceiling = update / writes
        enqueue = statistics.median(run["enqueue_per_s"] for run in ours)
        lines += [
            "- Ours, per batch of claimed work: claim = `SELECT` ids + `UPDATE … RETURNING` (write); "
            f"done = one `UPDATE` (write). Measured batch: {batch:.0f} items, so "
            f"{writes:.3f} write transactions per item and a ceiling of {update:,.0f} ÷ {writes:.3f} = "
            f"{ceiling:,.0f} items/s; the drain ({drain:,.0f}/s) is **{drain / ceiling:.1%}** of it: "
            "bounded by Python, not by the database's writes.",
            "- Without batching each item would need 2 write transactions (claim, done), as each "
            f"job does in django-tasks-db and Procrastinate: ceiling {update / 2:,.0f}/s. Peers' drains: "
            + ", ".join(
                f"{LABELS[p]} {statistics.median(r['drain_per_s'] for r in runs[p]):,.0f}/s "
                f"({statistics.median(r['drain_per_s'] for r in runs[p]) / (update / 2):.0%})"
                for p in SYSTEMS[1:]
            )
            + ".",
            "- Enqueue one by one is one `INSERT` transaction per item: ceiling "
            f"{result['insert_per_s']:,.0f}/s; "
            f"ours reaches {enqueue:,.0f}/s, {enqueue / result['insert_per_s']:.0%} of it.",
        ]
        share = enqueue / result["insert_per_s"]
        if "enqueue_shares" in result:
            shares, micros = result["enqueue_shares"], result["enqueue_micros"]
            lines.append(
                f"- The same share interleaved in one process ({result['enqueue_rounds']} rounds of 100 "
                "calls per cell; the raw INSERT took "
                f"{micros['raw INSERT']:.0f} µs): `enqueue()` on Django's default connection options "
                f"{shares['default']:.0%}, on prepared statements (`server_side_binding` and "
                f"`prepare_threshold`, the opt-in) {shares['prepared']:.0%}, while no runner waits (no "
                "`NOTIFY`: the enqueue phase above); while a runner waits (each enqueue notifies) "
                f"{shares['default, a runner waits']:.0%} and {shares['prepared, a runner waits']:.0%}. "
                "The app's INSERT statement alone, with its parameters, on bare psycopg (no Django "
                f"cursor, no checks): {shares['its INSERT alone']:.0%} bound as Django binds it, "
                f"{shares['its INSERT alone, prepared']:.0%} prepared: the most any `enqueue()` of this "
                "row can reach on this machine."
            )
        if "floor_latency_ms" in result and runs.get("procrastinate"):
            floor = result["floor_latency_ms"]
            peer = statistics.median(r["latency_median_ms"] for r in runs["procrastinate"])
            lines.append(
                "- The floor of an idle enqueue-to-start, by the same protocol: the simplest worker there "
                "can be (a psycopg process that LISTENs and claims the notified row with one `UPDATE … "
                "RETURNING`, then starts; the enqueue an `INSERT` whose row trigger notifies): two durable "
                f"commits and nothing else, median {floor:.1f} ms (the `INSERT` call "
                f"{result['floor_enqueue_ms']:.1f} ms, from its return to the start "
                f"{result['floor_pickup_ms']:.1f} ms); half of Procrastinate's idle latency in this run: "
                f"{peer / 2:.1f} ms."
            )
        targets.append(
            f"(#12) single enqueue ≥ {TARGET_IO_ENQUEUE_OF_INSERT:.0%} of the raw `INSERT` rate: "
            + verdict(share >= TARGET_IO_ENQUEUE_OF_INSERT, f"{share:.0%}")
        )
    return "\n".join(lines), targets


def io_cells(reduced: bool) -> list[tuple[int, int]]:
    """(jobs, concurrency) of the io section's matrix."""
    if reduced:
        return [(IO_REDUCED_JOBS[concurrency], concurrency) for concurrency in IO_CONCURRENCY]
    return [(jobs, concurrency) for jobs in IO_JOBS for concurrency in IO_CONCURRENCY]


def run_io(options: argparse.Namespace, urls: dict[str, str]) -> list[dict[str, Any]]:
    results = []
    for jobs, concurrency in io_cells(options.io_reduced):
        for system, mode, save in IO_VARIANTS:
            python = sys.executable if system == "ours" else options.peers_python
            args = [python, "benchmarks/io_workload.py", system, "--database-url", urls[system]]
            args += ["--mode", mode, "--jobs", str(jobs), "--concurrency", str(concurrency)]
            try:
                results.append(run_json([*args, "--save"] if save else args))
                log(f"io cell: {json.dumps(results[-1])}")  # figures as they come, for a run cut short
            except SystemExit as failure:  # one cell's failure is a figure too, not the end
                log(f"io cell failed: {str(failure)[:300]}")
                results.append(
                    {
                        "system": system,
                        "mode": mode,
                        "save": save,
                        "jobs": jobs,
                        "concurrency": concurrency,
                        "failed": str(failure).splitlines()[-1][:200] if str(failure) else "failed",
                    }
                )
    return results


def io_label(result: dict[str, Any]) -> str:
    name = "ours" if result["system"] == "ours" else "Procrastinate"
    return f"{name} {result['mode']}" + (" + save()" if result["save"] else "")


def report_io(results: list[dict[str, Any]]) -> tuple[str, list[str]]:
    rows = [
        [f"{result['jobs']:,}", str(result["concurrency"]), io_label(result), "failed", "—", "—", "—", "—"]
        if "failed" in result
        else [
            f"{result['jobs']:,}",
            str(result["concurrency"]),
            io_label(result),
            f"{result['jobs_per_s']:,.0f}",
            f"{result['of_ideal']:.0%}",
            str(result["peak_connections"]),
            str(result["peak_threads"]),
            f"{result['peak_rss_mib']:.0f}",
        ]
        for result in results
    ]
    text = table(
        [
            "jobs",
            "concurrency",
            "system",
            "jobs/s",
            "of ideal",
            "peak connections",
            "peak threads",
            "peak RSS MiB",
        ],
        rows,
    )

    def cell(system: str, mode: str, save: bool, jobs: int, concurrency: int) -> dict[str, Any] | None:
        for result in results:
            if "failed" in result:
                continue
            if (result["system"], result["mode"], result["save"], result["jobs"], result["concurrency"]) == (
                system,
                mode,
                save,
                jobs,
                concurrency,
            ):
                return result
        return None

    targets = []
    ours, peer = cell("ours", "async", False, 5000, 512), cell("procrastinate", "async", False, 5000, 512)
    if ours and peer:
        multiple = ours["jobs_per_s"] / peer["jobs_per_s"]
        met = (
            ours["of_ideal"] >= TARGET_IO_ASYNC_OF_IDEAL
            and ours["peak_connections"] <= TARGET_IO_CONNECTIONS
            and ours["peak_threads"] <= TARGET_IO_THREADS
            and multiple >= TARGET_IO_PEER_MULTIPLE
        )
        targets.append(
            "I/O, ours async at 512 in flight over 5,000 jobs ≥ "
            f"{TARGET_IO_ASYNC_OF_IDEAL:.0%} of ideal on ≤ {TARGET_IO_CONNECTIONS} connections and "
            f"≤ {TARGET_IO_THREADS} threads, ≥ {TARGET_IO_PEER_MULTIPLE} times Procrastinate's async: "
            + verdict(
                met,
                f"{ours['of_ideal']:.0%}, {ours['peak_connections']} connections, {ours['peak_threads']} "
                f"threads, {multiple:.1f} times "
                f"({ours['jobs_per_s']:,.0f}/s against {peer['jobs_per_s']:,.0f}/s)",
            )
        )
    saving = next(
        (
            r
            for r in results
            if "failed" not in r
            and r["system"] == "ours"
            and r["mode"] == "sync"
            and r["save"]
            and r["concurrency"] == 128
        ),
        None,
    )
    if saving:
        met = (
            saving["of_ideal"] >= TARGET_IO_SYNC_SAVE_OF_IDEAL
            and saving["peak_connections"] <= TARGET_IO_CONNECTIONS
        )
        targets.append(
            f"I/O, ours sync with one save() per job at 128 ≥ {TARGET_IO_SYNC_SAVE_OF_IDEAL:.0%} of ideal on "
            f"≤ {TARGET_IO_CONNECTIONS} connections: "
            + verdict(
                met,
                f"{saving['of_ideal']:.0%} over {saving['jobs']:,} jobs, "
                f"{saving['peak_connections']} connections",
            )
        )
    return text, targets


# --- Main -----------------------------------------------------------------------------------


SHORT_POLL = 0.1  # WAKEUP_FALLBACK_POLL_INTERVAL's default, which the benchmark keeps


def merged_versions(sources: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
    """One version per package across the systems that ran (``(system, versions)`` pairs);
    a package the systems ran at different versions (ours in the app's venv, the peers in
    theirs) lists each with the systems that ran it, e.g. "5.2.20 (ours), 5.2.19 (procrastinate)"."""
    seen: dict[str, dict[str, list[str]]] = {}
    for system, versions in sources:
        for package, version in versions.items():
            seen.setdefault(package, {}).setdefault(version, [])
            if system not in seen[package][version]:
                seen[package][version].append(system)
    return {
        package: next(iter(by_version))
        if len(by_version) == 1
        else ", ".join(f"{version} ({', '.join(systems)})" for version, systems in by_version.items())
        for package, by_version in seen.items()
    }


def pgbouncer_version() -> str:
    from tests.pgbouncer import BINARY

    completed = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=False)
    return completed.stdout.split()[1] if completed.stdout else "?"


def run_pgbouncer(options: argparse.Namespace, server: str) -> dict[str, list[dict[str, Any]]]:
    """Each run of each variant with a fresh private PgBouncer (so the benchmark's check that
    nothing else is connected sees no idle server sessions of an earlier one)."""
    from urllib.parse import urlsplit

    from tests.pgbouncer import PgBouncer

    upstream = urlsplit(server)
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    names = list(VARIANTS)
    for run in range(options.runs):
        order = names[run % len(names) :] + names[: run % len(names)]
        for variant in order:
            system, route, _ = VARIANTS[variant]
            database = f"nw_cmp_pgb_{system}"
            direct = ensure_database(server, database)
            python = sys.executable if system == "ours" else options.peers_python
            log(f"run {run + 1}/{options.runs}: {variant}")
            with PgBouncer(
                upstream.hostname or "127.0.0.1", upstream.port or 5432, user=upstream.username or "postgres"
            ) as bouncer:
                args = [
                    python,
                    "benchmarks/run_system.py",
                    system,
                    "--database-url",
                    direct if route == "direct" else bouncer.url(database),
                    "--items",
                    str(options.items),
                    "--latency-samples",
                    str(options.latency_samples),
                    "--procrastinate-concurrency",
                    str(options.procrastinate_concurrency),
                ]
                if route == "pooled+wakeup":
                    args += ["--wakeup-database-url", direct]
                runs[variant].append(run_json(args))
    return runs


def report_pgbouncer(runs: dict[str, list[dict[str, Any]]], poll: float) -> tuple[str, list[str]]:
    def values(variant: str, key: str) -> list[float]:
        return [run[key] for run in runs[variant] if key in run]

    def ratios(variant: str, baseline: str, key: str) -> list[float]:
        pairs = zip(runs[variant], runs[baseline], strict=True)
        return [v[key] / b[key] for v, b in pairs if key in v and key in b]

    rows = [
        ["enqueue one by one (/s)", *(spread(values(v, "enqueue_per_s")) for v in VARIANTS)],
        ["bulk enqueue (/s)", *(spread(values(v, "bulk_enqueue_per_s")) for v in VARIANTS)],
        ["drain, 1 worker process (/s)", *(spread(values(v, "drain_per_s")) for v in VARIANTS)],
        [
            "idle enqueue-to-start latency, median (ms)",
            *(spread(values(v, "latency_median_ms"), ",.1f") for v in VARIANTS),
        ],
        [
            "idle latency, slowest sample (ms)",
            *(spread([max(run["latency_ms"]) for run in runs[v]], ",.1f") for v in VARIANTS),
        ],
        [
            "runner's wake-up mode",
            *(
                ", ".join(sorted({str(run.get("wakeup_mode")) for run in runs[v]}))
                if VARIANTS[v][0] == "ours"
                else "—"
                for v in VARIANTS
            ),
        ],
    ]
    lines = [table(["", *(VARIANTS[v][2] for v in VARIANTS)], rows), ""]
    ratio_rows = [
        [
            VARIANTS[variant][2],
            spread(ratios(variant, baseline, "enqueue_per_s"), ".2f") + "x",
            spread(ratios(variant, baseline, "bulk_enqueue_per_s"), ".2f") + "x",
            spread(ratios(variant, baseline, "drain_per_s"), ".2f") + "x",
            spread(ratios(variant, baseline, "latency_median_ms"), ".2f") + "x",
        ]
        for variant, baseline in (
            ("ours-pooled", "ours-direct"),
            ("ours-pooled-wakeup", "ours-direct"),
            ("procrastinate-pooled", "procrastinate-direct"),
        )
    ]
    lines += [
        "Through PgBouncer relative to direct, same system, same run (median (min-max)):",
        "",
        table(["", "enqueue", "bulk enqueue", "drain", "idle latency"], ratio_rows),
    ]

    def median_ratio(variant: str, key: str) -> float:
        return statistics.median(ratios(variant, "ours-direct", key))

    wakeup_latency = median_ratio("ours-pooled-wakeup", "latency_median_ms")
    pooled_latency = statistics.median(values("ours-pooled", "latency_median_ms"))
    targets = [
        f"via PgBouncer with WAKEUP_DATABASE: idle latency ≤ {TARGET_POOLED_LATENCY_MULTIPLE}x direct: "
        + verdict(wakeup_latency <= TARGET_POOLED_LATENCY_MULTIPLE, f"{wakeup_latency:.2f}x"),
        f"via PgBouncer without it: idle latency ≤ the short poll ({poll * 1000:g} ms): "
        + verdict(pooled_latency <= poll * 1000, f"{pooled_latency:.1f} ms"),
    ]
    for variant in ("ours-pooled", "ours-pooled-wakeup"):
        drain = median_ratio(variant, "drain_per_s")
        targets.append(
            f"{VARIANTS[variant][2]}: drain ≥ {TARGET_POOLED_DRAIN:.0%} of direct: "
            + verdict(drain >= TARGET_POOLED_DRAIN, f"{drain:.0%}")
        )
    return "\n".join(lines), targets


def main() -> None:
    options = parse_args()
    server = options.postgres_url.rstrip("/")
    if options.wait_load is not None:
        wait_for_quiet(options.wait_load, options.wait_max)
    started = datetime.datetime.now(datetime.UTC)
    load_at_start = os.getloadavg()
    prefix = options.database_prefix
    urls = {system: ensure_database(server, f"{prefix}_{system.replace('-', '_')}") for system in RUN_ORDER}
    growth_url = ensure_database(server, f"{prefix}_growth")
    raw: dict[str, Any] = {"machine": machine(server), "options": vars(options)}
    timings: dict[str, float] = {}

    def section(name: str, work: Callable[[], Any]) -> Any:
        if name not in options.sections:
            return None
        log(f"section {name}")
        began = time.perf_counter()
        raw[name] = work()
        timings[name] = time.perf_counter() - began
        return raw[name]

    growth_script = [sys.executable, "benchmarks/growth.py"]
    runs = section("compare", lambda: run_compare(options, urls))
    scaling = section(
        "scaling",
        lambda: run_json(
            [
                *growth_script,
                "scaling",
                "--database-url",
                urls["ours"],
                "--items",
                str(options.scaling_items),
                "--runs",
                str(options.runs),
            ]
        ),
    )
    growth = section(
        "growth",
        lambda: run_json(
            [
                *growth_script,
                "growth",
                "--database-url",
                growth_url,
                "--runs",
                str(options.runs),
                "--sizes",
                *map(str, options.growth_sizes),
            ]
        ),
    )
    purge = section(
        "purge",
        lambda: run_json(
            [
                *growth_script,
                "purge",
                "--database-url",
                growth_url,
                "--expired",
                str(options.purge_expired),
                "--backlog",
                str(options.purge_backlog),
            ]
        ),
    )
    limit = section("limit", lambda: run_json([*growth_script, "limit", "--database-url", urls["ours"]]))
    io = section("io", lambda: run_io(options, urls))
    pooled = section("pgbouncer", lambda: run_pgbouncer(options, server))
    load_at_end = os.getloadavg()

    info = raw["machine"]
    sources: list[tuple[str, dict[str, str]]] = []
    if runs:
        sources += [(system, runs[system][0]["versions"]) for system in RUN_ORDER]
    if pooled:
        sources += [(variant, variant_runs[0]["versions"]) for variant, variant_runs in pooled.items()]
        sources.append(("pgbouncer", {"PgBouncer": pgbouncer_version()}))
    for cell in io or []:  # an io-only run has no other source of versions
        sources.append((cell.get("system", "io"), cell.get("versions", {})))
    versions = merged_versions(sources)
    out = [
        f"## Benchmarks ({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {info['cores']} cores ({info['cpu_model']}), {info['memory_gib']} GiB RAM, "
        f"Linux {info['kernel']}, "
        f"Python {info['python']}, PostgreSQL {info['postgres']['server_version']} on the same machine "
        f"(synchronous_commit={info['postgres']['synchronous_commit']}, fsync={info['postgres']['fsync']}, "
        f"autovacuum={info['postgres']['autovacuum']}, shared_buffers={info['postgres']['shared_buffers']}). "
        f"Load average (1, 5, 15 min) at the start {', '.join(f'{x:.2f}' for x in load_at_start)}, "
        f"at the end {', '.join(f'{x:.2f}' for x in load_at_end)}.",
        "",
        "Versions: " + ", ".join(f"{name} {version}" for name, version in sorted(versions.items())) + ".",
        "",
        "Command: `"
        + " ".join(["benchmarks/compare", *user_arguments()])
        + "`"
        + f" (took {sum(timings.values()) / 60:.1f} min: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
        + ").",
        "",
    ]
    targets: list[str] = []
    if runs:
        text, met = report_compare(runs, options)
        targets += met
        out += [
            f"### Side by side: {options.items:,} no-op jobs, one worker process each, "
            f"{options.runs} runs per system "
            "(alternating), median (min-max)",
            "",
            text,
            "",
        ]
        text, met = report_tasks(runs)
        targets += met
        out += [
            "### Django's Tasks API: the same `@task` module on our backend and on django-tasks-db's",
            "",
            f"{options.items:,} no-op tasks enqueued with `Task.enqueue()`, one worker process each, "
            "from the same runs as above, median (min-max).",
            "",
            text,
            "",
        ]
    if scaling:
        out += ["### Scaling: our drain with more `runworkflows` processes", "", report_scaling(scaling), ""]
    if growth:
        text, met = report_growth(growth)
        targets += met
        out += ["### Growth: retained done rows in the table", "", text, ""]
    if purge:
        text, met = report_purge(purge)
        targets += met
        out += ["### Purge of expired rows while a runner drains", "", text, ""]
    if limit:
        text, met = report_limit(limit, runs)
        targets += met
        out += ["### The physical limit", "", text, ""]
    if io:
        text, met = report_io(io)
        targets += met
        out += [
            "### I/O workload: jobs that wait 200 ms, one worker process each",
            "",
            "Jobs enqueued in one commit, then ONE worker drains them (`benchmarks/io_workload.py`): "
            "jobs/s over first claim to last finish as the database records them; ideal = "
            "concurrency ÷ 0.2 s; peak sessions on the database (`pg_stat_activity`), peak threads "
            "and RSS of the worker (`/proc`), sampled every 20 ms. Ours: `CONCURRENCY` (sync) or "
            "`ASYNC_CONCURRENCY` (async) = concurrency, `DB_CONNECTIONS` default (8); "
            "Procrastinate: `procrastinate worker --concurrency`.",
            "",
            text,
            "",
        ]
    if pooled:
        text, met = report_pgbouncer(pooled, poll=SHORT_POLL)
        targets += met
        out += [
            f"### Behind PgBouncer (transaction pooling): {options.items:,} no-op jobs, "
            f"{options.runs} runs per variant (alternating), median (min-max)",
            "",
            "A private PgBouncer (`pool_mode = transaction`, default pool size 20) in front of the same "
            "PostgreSQL; the systems' DATABASE_URL points at it, everything else default. "
            '"WAKEUP_DATABASE direct": the runner LISTENs on a second alias that connects '
            "straight to PostgreSQL.",
            "",
            text,
            "",
        ]
    if targets:
        out += ["### Targets", "", *(f"- {line}" for line in targets), ""]
    report = "\n".join(out)
    print(report)
    Path(ROOT / "var").mkdir(exist_ok=True)
    stamp = f"{started:%Y%m%d-%H%M%S}"
    (ROOT / "var" / f"compare-{stamp}.md").write_text(report)
    (ROOT / "var" / f"compare-{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
    log(f"report written to var/compare-{stamp}.md (raw figures in var/compare-{stamp}.json)")


if __name__ == "__main__":
    main()
