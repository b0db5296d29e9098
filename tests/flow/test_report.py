"""What status, the admin and metrics say about flow limits."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.flow.report import flow_metrics, waiting_on_limit_q, waiting_reason
from nexus_workflows.models import DeferredWork

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def test_waits_by_reason_in_metrics_status_admin_filter_and_card(register_workflow: Any) -> None:
    keyed = register_workflow(noop, retry_schedule=[1], concurrency=2, serial_key=lambda t: t["to"]).kind
    rated = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 60)).kind
    # Key a: 3 items, b: 2, c: 1. Two start (slots 2 of 2); the rest wait.
    enqueue_many(keyed, [{"key": n, "to": to} for n, to in enumerate("aaabbc")])
    enqueue_many(rated, [{"key": n} for n in range(3)])
    Claimer(kinds=[keyed, rated], using="default").claim_due(10)

    metrics = flow_metrics()
    # The first a and the first b run (the earliest ready item of each key, both slots);
    # the other two a and the other b wait for their key, and c, whose key is free, for a slot.
    assert metrics[keyed] == {"slots_in_use": 2, "waiting_key": 3, "waiting_slot": 1, "waiting_rate": 0}
    assert metrics[rated] == {"slots_in_use": 1, "waiting_key": 0, "waiting_slot": 0, "waiting_rate": 2}

    out = StringIO()
    call_command("workflows", "status", stdout=out)
    text = out.getvalue()
    assert "Flow control (due items waiting, by reason):" in text
    assert re.search(rf"{rated} +rate 1 per 60s; running 1; waiting: key 0, slot 0, rate 2\n", text)
    line = rf"{keyed} +concurrency 2, serial key; running 2/2; waiting: key 3, slot 1, rate 0\n"
    assert re.search(line, text)

    held = DeferredWork.objects.filter(waiting_on_limit_q())
    assert held.count() == 6
    reasons = {waiting_reason(work) for work in held}
    assert any(reason and reason.startswith("rate limit:") for reason in reasons)
    assert any(reason and reason.startswith("concurrency: all 2 slots") for reason in reasons)
    running = DeferredWork.objects.filter(status="processing").first()
    assert waiting_reason(running) is None
