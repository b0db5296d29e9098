"""Benchmark of PHI token map encodes: warm-cache repeats and new allocations.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/nw_phi_bench .venv/bin/python benchmarks/phi_encode.py

Migrates the database it is given, encodes into fresh conversation codes, prints its
figures and deletes what it wrote. One process, one thread. With no PHI keys in the
environment it generates throw-away ones for the run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("NEXUS_WORKFLOWS_LOG_LEVEL", "WARNING")
if "PHI_HMAC_KEY" not in os.environ and "PHI_ENCRYPTION_KEYS" not in os.environ:
    import secrets

    from cryptography.fernet import Fernet

    os.environ["PHI_HMAC_KEY"] = secrets.token_urlsafe(48)
    os.environ["PHI_ENCRYPTION_KEYS"] = Fernet.generate_key().decode()

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from nexus_workflows.phi import encode  # noqa: E402
from nexus_workflows.phi.cache import token_cache  # noqa: E402
from nexus_workflows.phi.models import TokenMap  # noqa: E402

# (category, spelling encoded first, the same spelling again, another spelling of the value)
WARM_CASES = [
    ("PERSONA", "María Guadalupe López", "María Guadalupe López", "maria guadalupe lopez"),
    ("TELEFONO", "+52 55 1234 5678", "+52 55 1234 5678", "(55) 1234-5678"),
    ("EMAIL", "Maria.Lopez@Example.com", "Maria.Lopez@Example.com", "maria.lopez@example.com"),
    ("ID", "LOMG-800101-MDF", "LOMG-800101-MDF", "lomg800101mdf"),
]


def time_calls(
    call: Callable[[int], object], count: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Seconds taken by each of ``count`` calls (``before`` runs untimed before each)."""
    durations = []
    clock = time.perf_counter
    for index in range(count):
        if before is not None:
            before()
        start = clock()
        call(index)
        durations.append(clock() - start)
    return durations


def describe(durations: list[float], unit: float, unit_name: str) -> str:
    ordered = sorted(durations)
    median = statistics.median(ordered)
    p90 = ordered[int(len(ordered) * 0.9)]
    return (
        f"median {median / unit:8.2f} {unit_name}   p90 {p90 / unit:8.2f} {unit_name}   "
        f"{len(durations) / sum(durations):10,.0f}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20_000, help="warm-cache encodes per case")
    parser.add_argument("--new", type=int, default=2_000, help="new values to allocate")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    server = connection.Database.__name__
    if connection.vendor == "postgresql":
        server = f"PostgreSQL {connection.pg_version // 10000}.{connection.pg_version % 10000}"
    elif connection.vendor == "sqlite":
        server = f"SQLite {connection.Database.sqlite_version}"
    print(f"database: {server}; python {platform.python_version()}; {os.cpu_count()} CPUs")

    run = uuid.uuid4().hex[:10]
    warm_code, new_code = f"bench-warm-{run}", f"bench-new-{run}"
    try:
        print(f"\nwarm cache (value already mapped, map cached), {args.repeats:,} encodes each:")
        state = None

        def forget_spellings() -> None:
            # Makes the next encode normalise and HMAC the value instead of finding
            # the exact spelling it has seen before.
            state.spellings.clear()

        all_same: list[float] = []
        all_other: list[float] = []
        for category, first, same, other in WARM_CASES:
            token = encode(warm_code, first, category)
            state = token_cache.peek(("default", warm_code))
            assert state is not None
            same_spelling = time_calls(lambda _i, s=same, c=category: encode(warm_code, s, c), args.repeats)
            assert encode(warm_code, other, category) == token
            other_spelling = time_calls(
                lambda _i, o=other, c=category: encode(warm_code, o, c), args.repeats, forget_spellings
            )
            all_same += same_spelling
            all_other += other_spelling
            print(f"  {category:<8} spelling seen before      {describe(same_spelling, 1e-6, 'µs')}")
            print(f"  {category:<8} another spelling, new     {describe(other_spelling, 1e-6, 'µs')}")
        print(f"  all      spelling seen before      {describe(all_same, 1e-6, 'µs')}")
        print(f"  all      another spelling, new     {describe(all_other, 1e-6, 'µs')}")

        print(f"\nnew values ({args.new:,} PERSONA values allocated into one code, one process):")
        encode(new_code, "warm up the map", "PERSONA")
        durations = time_calls(lambda i: encode(new_code, f"Paciente Número {i}", "PERSONA"), args.new)
        print(f"  allocation                  {describe(durations, 1e-3, 'ms')}")
        print(f"  => {args.new / sum(durations):,.0f} new allocations/s")

        # Reference: one durable commit of a one-row UPDATE on this database, the floor
        # of any allocation that is durable before its token is returned.
        reference = TokenMap.objects.for_code(new_code).get()
        commits = time_calls(
            lambda i: TokenMap.objects.filter(pk=reference.pk).update(updated_at=timezone.now()),
            min(args.new, 500),
        )
        print(f"  reference: bare commit      {describe(commits, 1e-3, 'ms')}")
    finally:
        for used in (warm_code, new_code):
            TokenMap.objects.for_code(used).delete()


if __name__ == "__main__":
    main()
