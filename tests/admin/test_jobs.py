"""nexus_workflows.admin.jobs: a fire-and-forget job's trigger and error message, revealed
only with the permission, after a POST, never cached and always audited (real Redis)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.test import override_settings
from django.urls import reverse
from rq.queue import Queue

from nexus_workflows import enqueue
from nexus_workflows.admin.jobs import audit_id
from nexus_workflows.fire_and_forget import get_queue
from tests.admin.conftest import client_for

pytestmark = pytest.mark.django_db(transaction=True)

# Values only the trigger and the error message hold, standing in for patient data.
PHONE = "+525598765432"
NAME = "Lucía <b>Hernández</b>"


@pytest.fixture
def failed_job(rq_redis: Any, rq_burst: Callable[..., int]) -> str:
    """A fire-and-forget job whose prepare failed with the patient's data in its message."""
    job_id = enqueue("test-ff-fail", {"key": "rv1", "secret": f"{NAME} {PHONE}"})
    assert rq_burst() == 1
    return job_id


def reveal_url(job_id: str, queue: str = "default") -> str:
    return reverse("admin:nexus_workflows_deferredwork_job_reveal", args=[queue, job_id])


def test_without_the_reveal_permission_nothing_is_shown_or_logged(failed_job: str, viewer: Any) -> None:
    client = client_for(viewer)
    for response in (client.get(reveal_url(failed_job)), client.post(reveal_url(failed_job))):
        assert response.status_code == 403
        assert PHONE not in response.content.decode()
    assert not LogEntry.objects.exists()


def test_anonymous_users_are_sent_to_the_login_page(failed_job: str, client: Any) -> None:
    response = client.post(reveal_url(failed_job))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert not LogEntry.objects.exists()


def test_a_get_confirms_and_a_post_reveals_escaped_not_cached_and_audited(
    failed_job: str, revealer: Any, settings: Any
) -> None:
    client = client_for(revealer)
    confirm = client.get(reveal_url(failed_job))
    assert confirm.status_code == 200
    assert "no-store" in confirm["Cache-Control"]
    page = confirm.content.decode()
    assert PHONE not in page
    assert 'method="post"' in page
    assert "test-ff-fail" in page
    assert not LogEntry.objects.exists()  # looking at the confirmation reveals nothing

    # Without the project's XFrameOptionsMiddleware (a client made after the override
    # loads the middleware without it): the page denies framing itself.
    without = [m for m in settings.MIDDLEWARE if "XFrameOptionsMiddleware" not in m]
    with override_settings(MIDDLEWARE=without):
        response = client_for(revealer).post(reveal_url(failed_job))
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    assert '<span class="nw-json-key">&quot;secret&quot;</span>' in html  # the trigger
    assert "Lucía &lt;b&gt;Hernández&lt;/b&gt; +525598765432" in html  # escaped
    assert "<b>Hernández</b>" not in html
    assert "UpstreamRejected: upstream rejected the message for Lucía &lt;b&gt;" in html  # the error
    queue_index = sorted(settings.RQ_QUEUES).index("default")
    assert reverse("admin:django_rq_job_detail", args=[queue_index, failed_job]) in html  # back link

    entry = LogEntry.objects.get()
    # The job id carries the dedupe key, and log entries are never purged: a keyed hash.
    hashed = audit_id("test-ff-fail", failed_job)
    assert (entry.object_id, entry.user, entry.action_flag) == (hashed, revealer, CHANGE)
    assert failed_job.split("__", 1)[1] not in entry.object_id
    assert response["X-Frame-Options"] == "DENY"
    assert entry.content_type is None
    assert "Revealed the trigger and error message of a test-ff-fail job" in entry.change_message
    assert entry.object_repr == "fire-and-forget test-ff-fail job"  # not the key, as for deferred work
    recorded = f"{entry.object_repr} {entry.change_message}"
    assert PHONE not in recorded
    assert "Lucía" not in recorded


def test_a_job_that_has_not_failed_shows_its_trigger_and_no_error(rq_redis: Any, revealer: Any) -> None:
    job_id = enqueue("test-ff-ledger", {"key": "rv2", "phone": PHONE}, delay=3600)
    html = client_for(revealer).post(reveal_url(job_id)).content.decode()
    assert PHONE in html
    assert "None: the job has not failed." in html
    assert LogEntry.objects.count() == 1


def test_unknown_queues_jobs_and_jobs_not_ours_are_not_found(rq_redis: Any, revealer: Any) -> None:
    queue: Queue = get_queue("default")
    theirs = ({"key": "x", "phone": PHONE},)
    queue.enqueue_call("tests.testapp.workflows.ff_ledger", args=theirs, job_id="theirs")
    client = client_for(revealer)
    for url in (reveal_url("nope"), reveal_url("theirs"), reveal_url("nope", queue="no-such-queue")):
        response = client.post(url)
        assert response.status_code == 404
        assert PHONE not in response.content.decode()
    assert not LogEntry.objects.exists()


def test_a_value_no_key_opens_is_said_so_and_never_shown_as_ciphertext(
    failed_job: str, revealer: Any, settings: Any
) -> None:
    sealed = get_queue("default").fetch_job(failed_job).args[1]
    other_key = "b3RoZXItdGVzdC1vbmx5LXBoaS1mZXJuZXQta2V5LTE="
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [other_key]}
    html = client_for(revealer).post(reveal_url(failed_job)).content.decode()
    assert "its sealed trigger cannot be opened with any configured PHI encryption key" in html
    assert "its sealed error message cannot be opened" in html
    assert sealed not in html
    assert LogEntry.objects.count() == 1  # the attempt is audited all the same


def test_a_job_sent_before_triggers_were_sealed_is_revealed_too(
    rq_redis: Any, rq_burst: Callable[..., int], revealer: Any
) -> None:
    queue: Queue = get_queue("default")
    old = ("test-ff-fail", {"key": "rv3", "secret": PHONE})
    queue.enqueue_call("nexus_workflows.fire_and_forget.run_job", args=old, job_id="test-ff-fail__rv3")
    assert rq_burst() == 1
    html = client_for(revealer).post(reveal_url("test-ff-fail__rv3")).content.decode()
    assert html.count(PHONE) == 2  # the plain trigger, and the error sealed when it failed
    assert "UpstreamRejected: upstream rejected the message for +525598765432" in html


def test_a_get_does_not_tell_whether_a_job_exists_and_a_post_for_none_is_audited(
    failed_job: str, revealer: Any
) -> None:
    """Whether a job exists for a key is patient data (its id is ``<kind>__<dedupe key>``):
    the confirmation page answers the same for a job that is not there, and the POST that
    finds none is recorded, as the find box records a search that finds nothing."""
    client = client_for(revealer)
    absent = failed_job.replace("rv1", "rv-absent")
    pages = [client.get(reveal_url(job_id)) for job_id in (failed_job, absent)]
    assert [page.status_code for page in pages] == [200, 200]
    # The same page but for the id asked for (and the form's CSRF token, masked anew each time).
    shown = [re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", page.content.decode()) for page in pages]
    assert shown[0].replace(failed_job, absent) == shown[1]
    assert not LogEntry.objects.exists()
    missing = client.post(reveal_url(absent))
    assert missing.status_code == 404
    entry = LogEntry.objects.get()
    assert entry.object_id == audit_id("test-ff-fail", absent)
    assert "rv-absent" not in f"{entry.object_id} {entry.object_repr} {entry.change_message}"
    assert (
        "Looked for a test-ff-fail job to reveal; none with that id was in its queue." in entry.change_message
    )
