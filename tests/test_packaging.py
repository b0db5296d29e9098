"""The app installs from its wheel and works in another Django project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.processes import PROJECT_ROOT

# Touches no database of the suite's: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent

OTHER_PROJECT_SETTINGS = """
SECRET_KEY = "another-project"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_rq",
    "nexus_workflows",
    "clinic",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "other.sqlite3"}}
RQ_QUEUES = {"default": {"URL": "redis://127.0.0.1:6379/0"}}
NEXUS_WORKFLOWS = {
    "CONCURRENCY": 2,
    # With DEBUG off the PHI keys are required (a system-check error otherwise).
    "PHI_HMAC_KEY": "another-project-phi-lookup-key-0123456789",
    "PHI_ENCRYPTION_KEYS": ["b3RoZXItcHJvamVjdC1waGktZmVybmV0LWtleS0wMDE="],
}
"""

CLINIC_WORKFLOWS = """
from nexus_workflows import workflow

@workflow("clinic-reminder", dedupe_key=lambda t: str(t["visit"]), retry_schedule=[1])
def reminder(trigger, checkpoints, save):
    save({"sent": True})
"""


def source_copy(into: Path) -> Path:
    """What the wheel is built from, copied: pip builds in the tree it is given and leaves
    build/ and the egg-info there, which two test legs running at once (bin/test) would
    share and delete under each other."""
    into.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(PROJECT_ROOT / name, into / name)
    app = "nexus_workflows"
    shutil.copytree(PROJECT_ROOT / app, into / app, ignore=shutil.ignore_patterns("__pycache__"))
    return into


@pytest.mark.slow
def test_the_wheel_installs_into_another_project(tmp_path: Path) -> None:
    source = source_copy(tmp_path / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, "."],
        cwd=source,
        check=True,
    )
    (wheel,) = tmp_path.glob("nexus_workflows-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nexus_workflows/migrations/0001_deferred_work.py" in names
    assert "nexus_workflows/py.typed" in names  # PEP 561: type checkers read the app's hints
    assert not any(name.startswith(("project/", "tests/", "benchmarks/")) for name in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)

    project = tmp_path / "other"
    (project / "clinic").mkdir(parents=True)
    (project / "clinic" / "__init__.py").write_text("")
    (project / "clinic" / "workflows.py").write_text(CLINIC_WORKFLOWS)
    (project / "other_settings.py").write_text(OTHER_PROJECT_SETTINGS)
    env = {
        **os.environ,
        # The wheel's copy of the app, the other project, and the shared dependencies --
        # but not this repository.
        "PYTHONPATH": os.pathsep.join([str(site), str(project), sysconfig.get_paths()["purelib"]]),
        "DJANGO_SETTINGS_MODULE": "other_settings",
    }

    def django_admin(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout + result.stderr

    assert str(site) in django_admin("shell", "-c", "import nexus_workflows; print(nexus_workflows.__file__)")
    django_admin("migrate", "-v", "0")
    enqueued = django_admin("workflows", "enqueue", "clinic-reminder", '{"visit": 1}')
    assert "enqueued clinic-reminder #1" in enqueued
    assert "1 done" in django_admin("runworkflows", "--once")


def readme_settings_snippet() -> str:
    """The Python block of the README's "Installing the app in another project"."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split("## Installing the app in another project", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("debug", [True, False])
def test_the_readme_settings_snippet_runs_as_pasted_into_a_fresh_startproject(
    tmp_path: Path, debug: bool
) -> None:
    env = {
        **{
            key: value
            for key, value in os.environ.items()
            if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        },
        "PYTHONPATH": str(PROJECT_ROOT),
        "PHI_HMAC_KEY": "a-fresh-project-phi-lookup-key-0123456789",
        "PHI_ENCRYPTION_KEYS": "ZnJlc2gtcHJvamVjdC1waGktZmVybmV0LWtleS0wMDE=",
    }
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "clinic"], cwd=tmp_path, env=env, check=True
    )
    settings = tmp_path / "clinic" / "clinic" / "settings.py"
    text = settings.read_text() + "\n" + readme_settings_snippet()
    if not debug:
        text += '\nDEBUG = False\nALLOWED_HOSTS = ["clinic.example"]\n'
    settings.write_text(text)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=tmp_path / "clinic",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for command in (["check"], ["migrate", "-v", "0"], ["workflows", "status"]):
        result = manage(*command)
        assert result.returncode == 0, result.stdout + result.stderr
    # With DEBUG off the keys come from the environment; without them the checks say so.
    if not debug:
        del env["PHI_HMAC_KEY"]
        result = manage("check")
        assert result.returncode != 0
        assert "nexus_workflows.E100" in result.stderr


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (PROJECT_ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, version = line.split("==")
            pins[package.split("[")[0].lower()] = version
    return pins


@pytest.mark.parametrize(
    ("requirements", "line"), [("requirements-django61.txt", "6.1."), ("requirements-django60.txt", "6.0.")]
)
def test_the_django6_requirements_pin_the_same_set_but_django(requirements: str, line: str) -> None:
    """bin/test's Django 6.1 and 6.0 legs must test what requirements.txt pins, Django, the
    Tasks backport (built into Django 6) and the type check (run once, in .venv) aside."""
    pinned, django6 = _pins("requirements.txt"), _pins(requirements)
    backport = {"django-tasks", "django-stubs-ext", "typing_extensions"}
    type_check = {
        "mypy",
        "mypy_extensions",
        "librt",
        "pathspec",
        "django-stubs",
        "types-pyyaml",
        "types-requests",
    }
    aside = backport | type_check
    assert django6.pop("django").startswith(line)
    assert {k: v for k, v in pinned.items() if k != "django" and k not in aside} == django6


def test_the_mariadb_driver_is_pinned_apart_within_the_mysql_extras_range() -> None:
    """bin/test's MariaDB leg tests the driver requirements-mysql.txt pins, which must lie
    in the range the ``mysql`` extra declares; requirements.txt (bin/setup, the quickstart)
    must not need it: building it needs the MariaDB client headers."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (declared,) = (Requirement(line) for line in extras["mysql"])
    pinned = _pins("requirements-mysql.txt")
    assert list(pinned) == [declared.name]
    assert declared.specifier.contains(pinned[declared.name])
    assert declared.name not in _pins("requirements.txt")
    assert "requirements-mysql.txt" in (PROJECT_ROOT / "bin" / "mariadb-deps").read_text()
