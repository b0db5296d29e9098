"""What ``UrlCredentialsFilter`` adds to an error report when a frame holds a large value:
Django's own ``SafeExceptionReporterFilter`` against ours, on the text report of one
exception whose frame holds the value (Django's ``ExceptionReporter.get_traceback_text``,
which formats every frame variable, as the mail to ``ADMINS`` does).

    .venv/bin/python benchmarks/error_report_filter.py [--rounds 3]

Values: a list of 1,000,000 short strings without a URL; a 20 MB string with a URL every
1,000 characters; a 2 MB string of ``"<31 letters>_://"`` repeated (each "://" makes the
filter look for a scheme before it, which fails only after backtracking over the letters:
the slowest text for its size we know). No database. Prints the median seconds per
report for each filter. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VALUES: dict[str, Any] = {
    "list of 1,000,000 strings": [f"item {number}" for number in range(1_000_000)],
    "20 MB string, a URL per 1,000 chars": ("x" * 962 + " redis://u:pw@cache:6379/0 ") * 20_000,
    "2 MB of '<31 letters>_://'": ("a" * 31 + "_://") * 58_255,
}
FILTERS = {
    "Django's": "django.views.debug.SafeExceptionReporterFilter",
    "UrlCredentialsFilter": "nexus_workflows.error_reports.UrlCredentialsFilter",
}


def failing(value: Any) -> None:
    raise ConnectionError("the queue's server did not answer")


def report_seconds(value: Any, filter_path: str) -> float:
    from django.test import RequestFactory
    from django.utils.module_loading import import_string
    from django.views.debug import ExceptionReporter

    # The request's own filter: Django caches the one its setting names per process.
    request = RequestFactory().get("/")
    request.exception_reporter_filter = import_string(filter_path)()  # type: ignore[attr-defined]
    try:
        failing(value)
    except ConnectionError:
        began = time.perf_counter()
        ExceptionReporter(request, *sys.exc_info()).get_traceback_text()
        return time.perf_counter() - began
    raise AssertionError("not raised")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    for name, value in VALUES.items():
        figures = []
        for label, path in FILTERS.items():
            seconds = [report_seconds(value, path) for _ in range(args.rounds)]
            figures.append(f"{label} {statistics.median(seconds):.3f} s")
        print(f"{name}: {'; '.join(figures)}")


if __name__ == "__main__":
    main()
