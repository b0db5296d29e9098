"""The side-by-side report's versions line (benchmarks/comparison.py): ours runs in the
app's venv and the peers in theirs, so a package may differ between them; the report must
not show one system's version as everyone's."""

from __future__ import annotations

from benchmarks.comparison import merged_versions


def test_a_package_at_different_versions_names_each_with_its_systems() -> None:
    merged = merged_versions(
        [
            ("ours", {"Django": "5.2.20", "psycopg": "3.3.9"}),
            ("django-tasks", {"Django": "5.2.19", "psycopg": "3.3.9", "django-tasks-db": "0.13.0"}),
            ("procrastinate", {"Django": "5.2.19", "procrastinate": "3.10.0"}),
        ]
    )
    assert merged == {
        "Django": "5.2.20 (ours), 5.2.19 (django-tasks, procrastinate)",
        "psycopg": "3.3.9",
        "django-tasks-db": "0.13.0",
        "procrastinate": "3.10.0",
    }
