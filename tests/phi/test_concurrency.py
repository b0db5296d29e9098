"""Eight real processes encode an overlapping set of 500 values into one code at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_workflows.phi import decode, normalize
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.phi.normalization import surface_form
from tests.phi.encode_worker import values
from tests.processes import url_of_test_database

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 8


def run_workers(code: str, count: int) -> list[dict[int, str]]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": url_of_test_database(),
        "PYTHONPATH": str(ROOT),
        "NEXUS_WORKFLOWS_LOG_LEVEL": "WARNING",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.phi.encode_worker", code, str(index)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    try:
        for worker in workers:  # every process connected before any starts encoding
            assert worker.stdout is not None
            line = worker.stdout.readline()
            assert line.strip() == "ready", worker.stderr.read() if worker.stderr else ""
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=180) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    answers = []
    for worker, (stdout, stderr) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, stderr
        answers.append(
            {int(key): token for key, token in json.loads(stdout.strip().splitlines()[-1]).items()}
        )
    return answers


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_encoding_overlapping_values_agree() -> None:
    code = "conversation-under-contention"
    table = values()
    assert len(table) == 500
    answers = run_workers(code, PROCESSES)

    # Everyone got the same answers.
    for answer in answers:
        assert answer == answers[0]
    tokens = answers[0]
    assert sorted(tokens) == list(range(500))
    # Each token exactly one value, of the value's category.
    assert len(set(tokens.values())) == 500
    for position, (category, _) in enumerate(table):
        assert tokens[position].startswith(f"<<{category}_")

    # Each value exactly one token in the database, numbered from one sequence, no gaps.
    token_map = TokenMap.objects.for_code(code).get()
    rows = list(PhiToken.objects.filter(token_map=token_map).values_list("token", "number"))
    assert len(rows) == 500
    assert {token for token, _ in rows} == set(tokens.values())
    assert sorted(number for _, number in rows) == list(range(1, 501))
    assert token_map.sequence == 500

    # Every stored surface is the richest spelling any process used, and is that value.
    token_cache.clear()
    decoded = decode(code, "\n".join(tokens[position] for position in range(500))).split("\n")
    for position, (category, spellings) in enumerate(table):
        assert decoded[position] == surface_form(spellings[0])
        assert normalize(decoded[position], category) == normalize(spellings[1], category)
