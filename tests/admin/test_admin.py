"""nexus_workflows.admin: the triage desk's list, detail page, actions and permissions."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:nexus_workflows_deferredwork_changelist"
# A value only the trigger and the checkpoints hold, standing in for patient data.
SECRET = "Maria-Lopez-5512345678"


def change_url(work: DeferredWork) -> str:
    return reverse("admin:nexus_workflows_deferredwork_change", args=[work.pk])


def action(client, name: str, works: list[DeferredWork], query: str = ""):
    return client.post(
        reverse(CHANGELIST) + query,
        {"action": name, "_selected_action": [w.pk for w in works], "index": 0},
        follow=True,
    )


def message_texts(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


# --- the list ---------------------------------------------------------------------------


def test_list_shows_the_triage_columns_and_no_key_trigger_checkpoints_or_message(
    superuser, make_work, workflow
):
    abandoned = make_work(
        Status.ABANDONED,
        dedupe_key="visit-nine",
        trigger={"patient": SECRET},
        checkpoints={"sent_to": SECRET},
    )
    make_work(Status.PENDING, trigger={"patient": SECRET}, attempt=1)

    response = client_for(superuser).get(reverse(CHANGELIST))

    assert response.status_code == 200
    html = response.content.decode()
    assert SECRET not in html
    assert "visit-nine" not in html  # dedupe keys are often derived from patient data
    assert workflow.kind in html
    assert 'class="nw-badge nw-badge--abandoned"' in html
    assert 'class="nw-badge nw-badge--pending"' in html
    # abandoned after attempt 3 of 3 (attempt counts failures: 2), pending retry 2 of 3
    assert "3 of 3" in html
    assert "2 of 3" in html
    # the exception type only, never its message (not even to a superuser on a list)
    assert '<code class="nw-error-type">UpstreamError</code>' in html
    assert "HTTP 503" not in html
    assert "retry budget exhausted" not in html
    assert f"#{abandoned.pk}" in html


def test_list_query_does_not_load_what_no_column_shows(superuser, make_work):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_work(Status.ABANDONED)
    with CaptureQueriesContext(connection) as queries:
        client_for(superuser).get(reverse(CHANGELIST))
    selects = [q["sql"] for q in queries if "nexus_workflows_deferredwork" in q["sql"]]
    assert selects
    for sql in selects:
        for unshown in ("trigger", "checkpoints", "history", "errors", "return_value"):
            assert f'"{unshown}"' not in sql, unshown


def test_a_page_reads_the_databases_clock_once_whatever_its_rows(superuser, make_work, stale_heartbeat):
    """The list's and the detail page's "ago", "due now" and "stale" are the database's
    time (README "One clock"), read in one query a page, never one a row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    clock_reads = ("SELECT statement_timestamp()", "SELECT UTC_TIMESTAMP(6)", "SELECT STRFTIME(")
    works = [make_work(), make_work(Status.PROCESSING), make_work(Status.ABANDONED)]
    works.append(make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat))
    client = client_for(superuser)
    for url in (reverse(CHANGELIST), change_url(works[1])):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        reads = [q["sql"] for q in queries if q["sql"].startswith(clock_reads)]
        assert len(reads) == 1, (url, reads)


def test_rows_of_unregistered_kinds_still_display(superuser, make_work):
    make_work(Status.ABANDONED, kind="retired-kind", attempt=4)

    response = client_for(superuser).get(reverse(CHANGELIST))

    assert response.status_code == 200
    html = response.content.decode()
    assert "retired-kind" in html
    assert "5 of" in html
    assert ">?</span>" in html


def test_the_search_box_posts_the_key_and_finds_only_the_exact_dedupe_key(viewer, make_work):
    make_work(Status.DONE, dedupe_key="visit-7770")
    work = make_work(Status.DONE, dedupe_key="visit-777", trigger={"patient": SECRET})
    client = client_for(viewer)
    find = reverse("admin:nexus_workflows_deferredwork_find")
    assert f'method="post" action="{find}"' in client.get(reverse(CHANGELIST)).content.decode()
    assert client.get(find).status_code == 405

    found = client.post(find, {"key": "visit-777"})
    assert (found.status_code, found["Location"]) == (302, change_url(work))
    # That work exists for a key (often a patient) is itself patient data: audited, keyless.
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user.username) == (str(work.pk), "viewer")
    assert entry.get_change_message() == "Found by its dedupe key (nothing was changed)."
    assert "visit-777" not in f"{entry.object_repr} {entry.change_message}"

    for miss in ("visit-77", SECRET, ""):  # no probing keys by their parts, nor triggers
        response = client.post(find, {"key": miss}, follow=True)
        assert response.redirect_chain == [(reverse(CHANGELIST), 302)]
        assert ("warning", "No deferred work has that dedupe key.") in message_texts(response)
    # A miss is audited too (an empty box is not), on the model, without the key.
    misses = LogEntry.objects.exclude(pk=entry.pk)
    assert [(m.object_id, m.user.username, m.content_type.model) for m in misses] == [
        (None, "viewer", "deferredwork")
    ] * 2
    for miss in misses:
        expected = "Looked for by a dedupe key that no work has (nothing was changed)."
        assert miss.get_change_message() == expected
        assert "visit-77" not in f"{miss.object_repr} {miss.change_message}"
        assert SECRET not in f"{miss.object_repr} {miss.change_message}"


def test_a_key_in_several_kinds_leads_to_the_first_and_names_the_others_by_kind_and_id(
    viewer, make_work, register_workflow
):
    first = make_work(Status.DONE, dedupe_key="visit-nine")
    other_kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    second = make_work(Status.PENDING, dedupe_key="visit-nine", kind=other_kind)
    response = client_for(viewer).post(
        reverse("admin:nexus_workflows_deferredwork_find"), {"key": "visit-nine"}, follow=True
    )
    shown = second if response.redirect_chain[0][0] == change_url(second) else first
    assert response.redirect_chain == [(change_url(shown), 302)]
    (level, text), *_ = message_texts(response)
    assert level == "info"
    assert text.startswith("2 items have that dedupe key: ")
    assert f"{first.kind} #{first.pk}" in text
    assert f"{other_kind} #{second.pk}" in text
    assert "visit-nine" not in response.content.decode()
    assert LogEntry.objects.count() == 2


def test_the_find_box_looks_only_at_what_the_filtered_list_shows(viewer, make_work, register_workflow):
    # Django's own search looks within the list's filters; so does the find box: with the
    # list filtered to one kind, a key two kinds share leads to that kind's item.
    first = make_work(Status.DONE, dedupe_key="visit-nine")
    other_kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    second = make_work(Status.PENDING, dedupe_key="visit-nine", kind=other_kind)
    client = client_for(viewer)
    find = reverse("admin:nexus_workflows_deferredwork_find")
    listed = client.get(reverse(CHANGELIST), {"kind": other_kind}).content.decode()
    assert f'name="_changelist_filters" value="kind={other_kind}"' in listed

    filters = f"kind={other_kind}&p=2"  # the page it was on does not hide the find
    found = client.post(find, {"key": "visit-nine", "_changelist_filters": filters}, follow=True)

    # Its page's way back leads to the filtered list; no "2 items" (the other is not listed).
    assert found.redirect_chain == [(f"{change_url(second)}?_changelist_filters=kind%3D{other_kind}", 302)]
    assert message_texts(found) == []
    assert [e.object_id for e in LogEntry.objects.all()] == [str(second.pk)]

    missed = client.post(
        find, {"key": "visit-nine", "_changelist_filters": f"kind={first.kind}&status=abandoned"}, follow=True
    )
    assert missed.redirect_chain == [(f"{reverse(CHANGELIST)}?kind={first.kind}&status=abandoned", 302)]
    assert message_texts(missed) == [
        (
            "warning",
            "No deferred work has that dedupe key. Only what the list shows with its filters was looked at.",
        )
    ]
    assert LogEntry.objects.filter(object_id=None).count() == 1  # the miss, audited as before
    assert "visit-nine" not in missed.content.decode()


def test_the_find_box_refuses_filters_the_list_does_not_offer(viewer, make_work):
    # The filters travel in the POST now: one the list refuses in its URL (a guess at a
    # trigger, letter by letter) must not pass through the find box either.
    make_work(Status.DONE, dedupe_key="visit-5", trigger={"patient": SECRET})
    response = client_for(viewer).post(
        reverse("admin:nexus_workflows_deferredwork_find"),
        {"key": "visit-5", "_changelist_filters": "trigger__patient__icontains=Maria"},
    )
    assert response.status_code == 400
    assert not LogEntry.objects.exists()


def test_a_key_typed_into_the_url_finds_nothing_and_is_never_echoed(superuser, make_work):
    # A key in a URL reaches access logs and browser history; on the page it would be a
    # dedupe key shown on a list page (and in every sort, filter and page link).
    make_work(Status.ABANDONED, dedupe_key="clinic-a-1")
    make_work(Status.PENDING, dedupe_key="clinic-a-2")
    client = client_for(superuser)

    response = client.get(reverse(CHANGELIST), {"q": "clinic-a-1", "o": "1"})

    assert list(response.context["cl"].result_list) == []
    assert "clinic-a-1" not in response.content.decode()
    work = DeferredWork.objects.get(dedupe_key="clinic-a-2")
    page = client.get(change_url(work), {"_changelist_filters": "q=clinic-a-1&o=1"}).content.decode()
    assert "clinic-a-1" not in page


def test_newest_first(superuser, make_work):
    """Newest first is the order rows were written (the primary key): read from the
    key's index, where an order by ``created_at`` (no index: the enqueue path pays for
    every index) sorted the whole table on every page (46 ms at 300,000 rows). A
    ``created_at`` from a host whose clock is behind does not move a row down."""
    old = make_work(Status.DONE)
    middle = make_work(Status.DONE)
    new = make_work(Status.DONE, created_at=timezone.now() - timedelta(hours=1))

    response = client_for(superuser).get(reverse(CHANGELIST))

    assert [w.pk for w in response.context["cl"].result_list] == [new.pk, middle.pk, old.pk]


def test_filters_by_status_and_kind(superuser, make_work):
    pending = make_work(Status.PENDING)
    other = make_work(Status.PENDING, kind="other-kind")
    make_work(Status.DONE)
    client = client_for(superuser)

    by_status = client.get(reverse(CHANGELIST), {"status": "pending"})
    by_both = client.get(reverse(CHANGELIST), {"status": "pending", "kind": "other-kind"})

    assert {w.pk for w in by_status.context["cl"].result_list} == {pending.pk, other.pk}
    assert [w.pk for w in by_both.context["cl"].result_list] == [other.pk]


def test_needs_attention_shows_abandoned_and_stale_processing(superuser, make_work, stale_heartbeat):
    abandoned = make_work(Status.ABANDONED)
    stale = make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat)
    make_work(Status.PROCESSING)
    make_work(Status.PENDING)
    make_work(Status.DONE)

    response = client_for(superuser).get(reverse(CHANGELIST), {"status": "attention"})

    assert {w.pk for w in response.context["cl"].result_list} == {abandoned.pk, stale.pk}
    assert "processing · stale" in response.content.decode()


def test_summary_counts_each_status_of_the_current_filter_with_links(
    superuser, make_work, workflow, stale_heartbeat
):
    for _ in range(3):
        make_work(Status.PENDING)
    make_work(Status.PROCESSING)
    make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat)
    make_work(Status.DONE)
    make_work(Status.ABANDONED)
    make_work(Status.ABANDONED)
    make_work(Status.ABANDONED, kind="other-kind")

    # filtered by status *and* kind: the counts keep the kind, leave out the status
    response = client_for(superuser).get(reverse(CHANGELIST), {"status": "abandoned", "kind": workflow.kind})

    summary = {item.value: item for item in response.context["cl"].status_summary}
    counts = {value: item.count for value, item in summary.items()}
    assert counts == {
        None: 8,
        "attention": 3,
        "pending": 3,
        "processing": 2,
        "stale": 1,
        "done": 1,
        "abandoned": 2,
    }
    assert summary["abandoned"].active
    assert not summary["pending"].active
    link = parse_qs(urlsplit(summary["pending"].url).query)
    assert link == {"status": ["pending"], "kind": [workflow.kind]}
    assert "status" not in parse_qs(urlsplit(summary[None].url).query)
    html = response.content.decode()
    assert 'class="nw-summary"' in html
    assert f'href="{escape(summary["pending"].url)}"' in html


# --- the detail page --------------------------------------------------------------------


def test_detail_shows_state_and_error_type_but_no_patient_data(superuser, viewer, make_work):
    work = make_work(
        Status.ABANDONED,
        dedupe_key="visit-4242",
        trigger={"patient": SECRET, "visit": 12},
        checkpoints={"summary_id": "S-1", "sent": True},
        history=[
            {"attempt": 0, "outcome": "rescheduled", "error": f"ValueError: no slot for {SECRET}"},
            {"attempt": 1, "outcome": "abandoned", "reason": "retry schedule exhausted", "error": "Boom: x"},
            {"event": "note", "reason": f"written by hand about {SECRET}"},
        ],
    )
    for user in (viewer, superuser):  # even with every permission: only after a POST
        response = client_for(user).get(change_url(work))
        assert response.status_code == 200
        html = response.content.decode()
        assert SECRET not in html
        assert "visit-4242" not in html
        assert "summary_id" not in html
        assert "HTTP 503" not in html
        assert "retry budget exhausted" not in html
        assert 'class="nw-json"' not in html
        assert '<code class="nw-error-type">UpstreamError</code>' in html
        assert "retry schedule exhausted" in html  # the runner's own reason
        assert "ValueError" in html  # the history's exception types
        assert f"#{work.pk}" in html
        assert work.kind in html
        assert "3 of 3" in html
        # read-only: no save buttons
        assert 'name="_save"' not in html
        assert 'name="_continue"' not in html
    assert 'name="revive"' in html  # the superuser's page
    assert reverse("admin:nexus_workflows_deferredwork_revive", args=[work.pk]) in html


def test_reveal_needs_the_dedicated_permission(superuser, viewer, triager, changer, make_work):
    work = make_work(Status.ABANDONED, trigger={"patient": SECRET})
    url = reverse("admin:nexus_workflows_deferredwork_reveal", args=[work.pk])
    for user in (viewer, triager, changer):
        client = client_for(user)
        detail = client.get(change_url(work)).content.decode()
        assert url not in detail
        assert "Can reveal triggers, checkpoints and error messages" in detail  # says why
        for response in (client.get(url), client.post(url)):
            assert response.status_code == 403
            assert SECRET not in response.content.decode()
    assert not LogEntry.objects.exists()


def test_reveal_shows_the_payload_after_a_post_no_store_and_audited(revealer, make_work):
    work = make_work(
        Status.ABANDONED,
        dedupe_key="visit-4242",
        trigger={"patient": SECRET, "visit": 12},
        checkpoints={"summary_id": "S-1", "sent": True},
    )
    client = client_for(revealer)
    detail = client.get(change_url(work)).content.decode()
    url = reverse("admin:nexus_workflows_deferredwork_reveal", args=[work.pk])
    assert f'action="{url}"' in detail  # a POST form on the detail page
    assert 'method="post"' in detail

    confirm = client.get(url)
    assert confirm.status_code == 200
    assert SECRET not in confirm.content.decode()
    assert not LogEntry.objects.exists()  # looking at the confirmation reveals nothing

    response = client.post(url)
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    assert SECRET in html
    assert "visit-4242" in html
    assert '<span class="nw-json-key">&quot;summary_id&quot;</span>' in html
    assert '<span class="nw-json-literal">true</span>' in html
    assert "UpstreamError: HTTP 503 from the scheduler\nretry budget exhausted" in html
    assert "UpstreamError: timeout" in html  # the history's messages

    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user, entry.action_flag) == (str(work.pk), revealer, CHANGE)
    assert "Revealed the dedupe key, trigger, checkpoints and error messages" in entry.get_change_message()
    assert SECRET not in entry.change_message + entry.object_repr
    assert "visit-4242" not in entry.change_message + entry.object_repr
    client.post(url)
    assert LogEntry.objects.count() == 2  # one entry per reveal


def test_revealed_payload_is_escaped(revealer, make_work):
    work = make_work(
        Status.ABANDONED,
        trigger={"note": "<script>alert(1)</script>"},
        last_error="Boom: <img src=x onerror=alert(1)>",
    )

    html = (
        client_for(revealer)
        .post(reverse("admin:nexus_workflows_deferredwork_reveal", args=[work.pk]))
        .content.decode()
    )

    assert "<script>alert(1)</script>" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_detail_has_no_revive_button_unless_abandoned(superuser, make_work):
    client = client_for(superuser)
    for status in (Status.PENDING, Status.PROCESSING, Status.DONE):
        html = client.get(change_url(make_work(status))).content.decode()
        assert 'name="revive"' not in html


def test_detail_revive_button_revives_and_logs(triager, make_work):
    work = make_work(Status.ABANDONED)
    client = client_for(triager)

    response = client.post(reverse("admin:nexus_workflows_deferredwork_revive", args=[work.pk]), follow=True)

    assert response.redirect_chain[-1][0] == change_url(work)
    assert ("success", "Revived 1 item; skipped none.") in message_texts(response)
    work.refresh_from_db()
    assert work.status == Status.PENDING
    assert work.history[-1]["user"] == "triager"
    entry = LogEntry.objects.get()
    assert entry.user == triager
    assert entry.object_id == str(work.pk)
    assert entry.action_flag == CHANGE


def test_detail_buttons_need_post(triager, make_work):
    work = make_work(Status.ABANDONED)

    response = client_for(triager).get(reverse("admin:nexus_workflows_deferredwork_revive", args=[work.pk]))

    assert response.status_code == 405
    work.refresh_from_db()
    assert work.status == Status.ABANDONED


def test_run_now_button_on_waiting_pending_work(triager, make_work):
    later = timezone.now() + timedelta(hours=1)
    work = make_work(Status.PENDING, attempt=1, next_attempt_at=later)
    client = client_for(triager)

    assert 'name="run-now"' in client.get(change_url(work)).content.decode()
    response = client.post(reverse("admin:nexus_workflows_deferredwork_run_now", args=[work.pk]), follow=True)

    assert ("success", "Made due now 1 item; skipped none.") in message_texts(response)
    work.refresh_from_db()
    assert work.next_attempt_at <= timezone.now()
    assert LogEntry.objects.get().user == triager


# --- actions ----------------------------------------------------------------------------


def test_revive_action_revives_abandoned_and_skips_the_rest(triager, make_work):
    abandoned = [make_work(Status.ABANDONED), make_work(Status.ABANDONED)]
    pending = make_work(Status.PENDING)
    running = make_work(Status.PROCESSING)
    running_before = DeferredWork.objects.filter(pk=running.pk).values().get()

    response = action(client_for(triager), "revive_selected", [*abandoned, pending, running])

    assert message_texts(response) == [
        ("warning", "Revived 2 items; skipped 2 that were not abandoned (1 pending, 1 processing).")
    ]
    for work in abandoned:
        work.refresh_from_db()
        assert work.status == Status.PENDING
        assert work.attempt == 0
        assert work.last_error == ""
        assert work.checkpoints == {"fetched": True}
    assert DeferredWork.objects.filter(pk=running.pk).values().get() == running_before


def test_revive_action_all_revived_is_a_success(superuser, make_work):
    works = [make_work(Status.ABANDONED) for _ in range(3)]

    response = action(client_for(superuser), "revive_selected", works, "?status=attention")

    assert message_texts(response) == [("success", "Revived 3 items; skipped none.")]
    assert set(DeferredWork.objects.values_list("status", flat=True)) == {Status.PENDING}


def test_revive_action_writes_one_log_entry_per_revived_row_naming_the_user(triager, make_work):
    revived = [make_work(Status.ABANDONED), make_work(Status.ABANDONED)]
    skipped = make_work(Status.DONE)

    action(client_for(triager), "revive_selected", [*revived, skipped])

    entries = LogEntry.objects.order_by("object_id")
    assert [(e.user, e.object_id, e.action_flag) for e in entries] == [
        (triager, str(w.pk), CHANGE) for w in sorted(revived, key=lambda w: w.pk)
    ]
    assert all("Revived" in e.get_change_message() for e in entries)
    assert all(e.object_repr.endswith("(pending)") for e in entries)


def test_run_now_action(triager, make_work):
    later = timezone.now() + timedelta(hours=1)
    waiting = make_work(Status.PENDING, next_attempt_at=later)
    running = make_work(Status.PROCESSING, next_attempt_at=later)

    response = action(client_for(triager), "run_selected_now", [waiting, running])

    assert message_texts(response) == [
        ("warning", "Made due now 1 item; skipped 1 that was not pending (1 processing).")
    ]
    waiting.refresh_from_db()
    running.refresh_from_db()
    assert waiting.next_attempt_at <= timezone.now()
    assert running.next_attempt_at == later
    assert [(e.user, e.object_id) for e in LogEntry.objects.all()] == [(triager, str(waiting.pk))]
    assert "Run now" in LogEntry.objects.get().get_change_message()


def test_reviving_an_unregistered_kind_warns(superuser, make_work):
    work = make_work(Status.ABANDONED, kind="retired-kind")

    response = action(client_for(superuser), "revive_selected", [work])

    texts = message_texts(response)
    assert texts[0] == ("success", "Revived 1 item; skipped none.")
    assert texts[1][0] == "warning"
    assert "retired-kind" in texts[1][1]


# --- permissions ------------------------------------------------------------------------


def test_actions_offered_by_permission(superuser, triager, changer, viewer, make_work):
    make_work(Status.ABANDONED)

    def offered(user) -> set[str]:
        response = client_for(user).get(reverse(CHANGELIST))
        assert response.status_code == 200
        form = response.context.get("action_form")
        return {value for value, _ in form.fields["action"].choices if value} if form else set()

    assert offered(superuser) == {"revive_selected", "run_selected_now", "delete_selected"}
    assert offered(triager) == {"revive_selected", "run_selected_now"}
    assert offered(changer) == {"delete_selected"}  # change alone does not allow reviving
    assert offered(viewer) == set()


@pytest.mark.parametrize("user_fixture", ["changer", "viewer"])
def test_without_the_permission_nothing_is_revived(request, user_fixture, make_work):
    user = request.getfixturevalue(user_fixture)
    work = make_work(Status.ABANDONED)
    client = client_for(user)

    action(client, "revive_selected", [work])
    button = client.post(reverse("admin:nexus_workflows_deferredwork_revive", args=[work.pk]))
    run_now = client.post(reverse("admin:nexus_workflows_deferredwork_run_now", args=[work.pk]))
    page = client.get(change_url(work)).content.decode()

    assert button.status_code == 403
    assert run_now.status_code == 403
    work.refresh_from_db()
    assert work.status == Status.ABANDONED
    assert not LogEntry.objects.exists()
    assert 'name="revive"' not in page
    assert "permission" in page  # says why there is no button


def test_nothing_is_addable_or_editable_by_hand(superuser, make_work):
    work = make_work(Status.ABANDONED)
    client = client_for(superuser)

    assert client.get(reverse("admin:nexus_workflows_deferredwork_add")).status_code == 403
    response = client.post(change_url(work), {"status": "done", "kind": "x", "dedupe_key": "y"})
    assert response.status_code == 403
    work.refresh_from_db()
    assert work.status == Status.ABANDONED
    assert (
        'href="' + reverse("admin:nexus_workflows_deferredwork_add")
        not in client.get(reverse(CHANGELIST)).content.decode()
    )


def test_delete_needs_the_delete_permission(triager, changer, make_work):
    work = make_work(Status.DONE)
    delete_url = reverse("admin:nexus_workflows_deferredwork_delete", args=[work.pk])

    assert client_for(triager).post(delete_url, {"post": "yes"}).status_code == 403
    assert DeferredWork.objects.filter(pk=work.pk).exists()

    response = client_for(changer).post(delete_url, {"post": "yes"})
    assert response.status_code == 302
    assert not DeferredWork.objects.filter(pk=work.pk).exists()


def test_staff_without_view_permission_sees_nothing(db, make_work):
    from django.contrib.auth.models import User

    nobody = User.objects.create_user("nobody", password="x", is_staff=True)
    work = make_work(Status.ABANDONED)
    client = client_for(nobody)

    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert client.get(change_url(work)).status_code == 403
    assert "Workflow triage" not in client.get(reverse("admin:index")).content.decode()


# --- one click from the admin index -----------------------------------------------------


@pytest.mark.parametrize("url_name", ["admin:index", "admin:app_list"])
def test_index_links_to_needs_attention(viewer, make_work, stale_heartbeat, url_name):
    make_work(Status.ABANDONED)
    make_work(Status.ABANDONED)
    make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat)
    kwargs = {"app_label": "nexus_workflows"} if url_name == "admin:app_list" else {}

    html = client_for(viewer).get(reverse(url_name, kwargs=kwargs)).content.decode()

    assert f'href="{reverse(CHANGELIST)}?status=attention"' in html
    assert "Needs attention (3)" in html
    assert "2 abandoned, 1 with a stale heartbeat" in html


def test_branding(superuser):
    html = client_for(superuser).get(reverse("admin:index")).content.decode()
    assert "Nexus operations" in html
    assert "<title>Site administration | Nexus operations</title>" in html


# --- bulk delete ------------------------------------------------------------------------


def _confirm_token(html: str) -> str:
    import re

    return re.search(r'name="confirm" value="([^"]+)"', html).group(1)


def _delete(client, works, **extra):
    data = {"action": "delete_selected", "_selected_action": [w.pk for w in works], "index": 0, **extra}
    return client.post(reverse(CHANGELIST), data)


def test_bulk_delete_shows_what_will_be_lost_before_deleting(changer, make_work):
    works = [make_work(Status.PENDING), make_work(Status.PENDING), make_work(Status.PROCESSING)]
    works.append(make_work(Status.DONE))
    client = client_for(changer)

    page = _delete(client, works)

    assert page.status_code == 200
    html = page.content.decode()
    assert DeferredWork.objects.count() == 4  # nothing deleted yet
    assert "delete <strong>4</strong> deferred work items" in html
    assert "3 of them are not finished" in html
    assert '<li data-status="pending"><strong>2 pending</strong>: will never run' in html
    assert '<li data-status="processing"><strong>1 processing</strong>: may be running right now' in html
    # Its slot and key go with the row, while its attempt may still be running (flow audit).
    assert "concurrency slot and its serial key are free at once" in html
    assert '<li data-status="done"><strong>1 done</strong>' in html
    assert "abandoned" not in html.split('class="nw-losses"')[1].split("</ul>")[0]

    done = _delete(client, works, post="yes", confirm=_confirm_token(html))

    assert done.status_code == 302
    assert not DeferredWork.objects.exists()
    deletions = LogEntry.objects.filter(action_flag=3, user=changer)
    assert sorted(int(entry.object_id) for entry in deletions) == sorted(w.pk for w in works)


def test_bulk_delete_is_not_done_by_one_crafted_post(changer, make_work):
    pending = make_work(Status.PENDING)
    response = _delete(client_for(changer), [pending], post="yes")
    assert response.status_code == 200  # the confirmation page, again
    assert "will never run" in response.content.decode()
    assert DeferredWork.objects.filter(pk=pending.pk).exists()


def test_a_confirmation_holds_only_for_its_user_selection_and_counts(changer, superuser, make_work):
    pending, done, other = make_work(Status.PENDING), make_work(Status.DONE), make_work(Status.PENDING)
    client = client_for(changer)
    token = _confirm_token(_delete(client, [pending, done]).content.decode())

    # Another selection, another user, or counts that changed since: shown again, kept.
    assert _delete(client, [pending, done, other], post="yes", confirm=token).status_code == 200
    assert _delete(client_for(superuser), [pending, done], post="yes", confirm=token).status_code == 200
    DeferredWork.objects.filter(pk=done.pk).update(status=Status.ABANDONED)
    assert _delete(client, [pending, done], post="yes", confirm=token).status_code == 200
    assert _delete(client, [pending, done], post="yes", confirm=token + "x").status_code == 200
    assert DeferredWork.objects.count() == 3


def test_bulk_delete_needs_the_delete_permission(triager, make_work):
    pending = make_work(Status.PENDING)
    client = client_for(triager)
    assert "delete_selected" not in client.get(reverse(CHANGELIST)).content.decode()
    _delete(client, [pending], post="yes")
    assert DeferredWork.objects.filter(pk=pending.pk).exists()


def test_one_items_delete_page_says_what_is_lost(changer, make_work):
    pending = make_work(Status.PENDING)
    url = reverse("admin:nexus_workflows_deferredwork_delete", args=[pending.pk])
    html = client_for(changer).get(url).content.decode()
    assert '<li data-status="pending"><strong>Pending work</strong> — will never run' in html
    assert DeferredWork.objects.filter(pk=pending.pk).exists()


@pytest.mark.parametrize(
    "lookup",
    [
        "trigger__patient__icontains",
        "trigger__icontains",
        "checkpoints__icontains",
        "last_error__icontains",
        "history__icontains",
        "dedupe_key__startswith",
        "errors__icontains",
        "return_value__icontains",
        "id__gt",
    ],
)
def test_the_list_filters_only_by_what_it_offers(viewer, make_work, lookup):
    """Django's admin filters by any field given in the URL; the row count would then
    answer guesses about patient data, letter by letter, without the reveal permission."""
    make_work(Status.ABANDONED, trigger={"patient": SECRET}, last_error=f"ValueError: {SECRET}")
    client = client_for(viewer)
    assert client.get(reverse(CHANGELIST), {lookup: "maria"}).status_code == 400
    offered = client.get(reverse(CHANGELIST), {"status": "abandoned", "flow": "limited", "kind__exact": "x"})
    assert offered.status_code == 200


def test_the_buttons_need_view_permission_as_well_as_revive(db, make_work):
    """Reviving a row one may not see is acting blind (reveal asks for both, too)."""
    from tests.admin.conftest import _user

    abandoned = make_work(Status.ABANDONED)
    client = client_for(_user("blind", "revive_deferredwork"))
    url = reverse("admin:nexus_workflows_deferredwork_revive", args=[abandoned.pk])
    assert client.post(url).status_code == 403
    assert DeferredWork.objects.get(pk=abandoned.pk).status == Status.ABANDONED


def test_a_reveal_page_denies_framing_without_the_projects_middleware(revealer, make_work):
    """Its button must not be clickable through another site's frame, whatever
    middleware the project that installs the app has."""
    from django.conf import settings
    from django.test import override_settings

    work = make_work(Status.ABANDONED)
    url = reverse("admin:nexus_workflows_deferredwork_reveal", args=[work.pk])
    without = [m for m in settings.MIDDLEWARE if "XFrameOptionsMiddleware" not in m]
    with override_settings(MIDDLEWARE=without):
        client = client_for(revealer)
        assert client.get(url)["X-Frame-Options"] == "DENY"
        assert client.post(url)["X-Frame-Options"] == "DENY"


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
@pytest.mark.parametrize("how", ["action", "button"])
def test_the_log_entry_of_a_revive_names_the_status_written_not_a_lagging_replicas(
    triager, make_work, settings, how
):
    """The replica (``direct``) lags: its session reads from a snapshot taken before the
    revive. The admin log entry names the row as revived ("pending"), read back from where
    it was written; read from the replica it said "abandoned"."""
    from django.contrib.admin.models import LogEntry
    from django.db import connections

    settings.DATABASE_ROUTERS = ["tests.testapp.routers.WorkReadFromDirect"]
    abandoned = make_work(Status.ABANDONED)
    replica = connections["direct"]
    with replica.cursor() as cursor:  # a snapshot from now on, as a replica behind the primary
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SELECT count(*) FROM {DeferredWork._meta.db_table}")
    try:
        client = client_for(triager)
        if how == "action":
            action(client, "revive_selected", [abandoned])
        else:
            url = reverse("admin:nexus_workflows_deferredwork_revive", args=[abandoned.pk])
            client.post(url, follow=True)
    finally:
        replica.close()  # its snapshot ends with it
    assert DeferredWork.objects.using("default").get(pk=abandoned.pk).status == Status.PENDING
    (entry,) = LogEntry.objects.filter(object_id=str(abandoned.pk))
    assert entry.object_repr == f"{abandoned.kind} #{abandoned.pk} (pending)"


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
@pytest.mark.parametrize("how", ["action", "button"])
def test_revive_and_run_now_write_where_the_router_sends_writes_not_to_the_read_replica(
    triager, make_work, settings, how
):
    """With a router that reads deferred work from a replica (here: the ``direct`` alias,
    its session read-only as a hot standby's) and writes it to the primary, the admin's
    list and its querysets read the replica; reviving and running now must still change
    the rows on the primary, as Django's own update() and delete() would."""
    from django.db import connections

    settings.DATABASE_ROUTERS = ["tests.testapp.routers.WorkReadFromDirect"]
    abandoned = make_work(Status.ABANDONED)
    waiting = make_work(Status.PENDING, next_attempt_at=timezone.now() + timedelta(hours=1))
    replica = connections["direct"]
    with replica.cursor() as cursor:
        cursor.execute("SET SESSION default_transaction_read_only = on")
    try:
        client = client_for(triager)
        if how == "action":
            revived = action(client, "revive_selected", [abandoned])
            made_due = action(client, "run_selected_now", [waiting])
        else:
            url = "admin:nexus_workflows_deferredwork_{}"
            revived = client.post(reverse(url.format("revive"), args=[abandoned.pk]), follow=True)
            made_due = client.post(reverse(url.format("run_now"), args=[waiting.pk]), follow=True)
    finally:
        replica.close()  # its read-only session ends with it
    assert ("success", "Revived 1 item; skipped none.") in message_texts(revived)
    assert ("success", "Made due now 1 item; skipped none.") in message_texts(made_due)
    rows = DeferredWork.objects.using("default")
    assert rows.get(pk=abandoned.pk).status == Status.PENDING
    assert rows.get(pk=waiting.pk).next_attempt_at <= timezone.now()


# --- due work of kinds no runner knows ----------------------------------------------------


def test_list_names_due_work_of_kinds_no_runner_knows_and_filters_it(superuser, make_work, workflow):
    """A kind removed from the code leaves due rows nothing claims or purges. The list says
    so above the rows (kind and count, whatever the filter) and links to a filter showing
    that work; known kinds and tasks that load are not named."""
    past = timezone.now() - timedelta(minutes=5)
    make_work(Status.PENDING, next_attempt_at=past)
    stuck = [
        DeferredWork.objects.create(
            kind="reminders.removed-kind", dedupe_key=f"visit-{n}", trigger={}, next_attempt_at=past
        )
        for n in range(2)
    ]
    DeferredWork.objects.create(
        kind="tests.testapp.tasks.add",
        dedupe_key="task",
        trigger={},
        next_attempt_at=past,
        backend_name="default",
        queue_name="default",
    )
    client = client_for(superuser)
    html = client.get(reverse(CHANGELIST) + "?status=abandoned").content.decode()
    assert "nw-notice--unknown-kinds" in html
    assert "<li><code>reminders.removed-kind</code>: 2</li>" in html
    assert "tests.testapp.tasks.add</code>" not in html
    assert f"<li><code>{workflow.kind}</code>" not in html
    assert "visit-" not in html

    response = client.get(reverse(CHANGELIST) + "?status=unknown")
    assert {work.pk for work in response.context["cl"].result_list} == {work.pk for work in stuck}


def test_list_has_no_unknown_kinds_notice_when_every_due_kind_is_known(superuser, make_work):
    make_work(Status.PENDING, next_attempt_at=timezone.now() - timedelta(minutes=5))
    html = client_for(superuser).get(reverse(CHANGELIST)).content.decode()
    assert "nw-notice--unknown-kinds" not in html
