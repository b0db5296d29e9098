"""The triage desk in a real browser: headless Chromium driving a live server."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.urls import reverse
from django.utils import timezone

from nexus_workflows.admin.jobs import audit_id
from nexus_workflows.deferred.history import append_entry
from nexus_workflows.deferred.registry import registry
from nexus_workflows.models import DeferredWork, Status
from tests.admin import browser
from tests.conftest import IN_CI

PASSWORD = "correct horse battery staple"
KIND = "browser-visit-summary"


def _noop(trigger: object, checkpoints: object, save: object) -> None:
    return None


@pytest.mark.browser
class TriageDeskInChromium(StaticLiveServerTestCase):
    """Log in, open "needs attention" from the index, revive an abandoned row."""

    @classmethod
    def setUpClass(cls) -> None:
        missing = browser.missing()
        if missing:
            message = f"headless Chromium is not installed ({', '.join(missing)}); run bin/browser-deps"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        super().setUpClass()
        registry.register(KIND, dedupe_key=lambda t: str(t["visit"]), prepare=_noop, retry_schedule=[1, 5])

    @classmethod
    def tearDownClass(cls) -> None:
        registry.unregister(KIND)
        super().tearDownClass()

    def setUp(self) -> None:
        now = timezone.now()
        self.abandoned = DeferredWork.objects.create(
            kind=KIND,
            dedupe_key="visit-4711",
            trigger={"visit": 4711},
            checkpoints={"summary_id": "S-88"},
            status=Status.ABANDONED,
            attempt=2,
            last_error="UpstreamError: HTTP 503\nthe scheduler is down",
            history=append_entry([], attempt=2, outcome="abandoned", reason="retry schedule exhausted"),
            updated_at=now,
        )
        self.done = DeferredWork.objects.create(
            kind=KIND, dedupe_key="visit-4712", trigger={"visit": 4712}, status=Status.DONE, updated_at=now
        )

    def _user(self, username: str, *codenames: str) -> User:
        user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="nexus_workflows", codename__in=codenames)
        )
        return user

    def _log_in(self, driver, username: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        driver.get(f"{self.live_server_url}/admin/login/?next=/admin/")
        driver.find_element(By.NAME, "username").send_keys(username)
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.ID, "nw-needs-attention")))

    def _open_needs_attention(self, driver) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        link = driver.find_element(By.ID, "nw-needs-attention")
        assert "Needs attention (1)" in link.text
        link.click()
        WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.ID, "result_list")))
        assert "status=attention" in driver.current_url

    def test_revive_from_needs_attention(self) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import Select, WebDriverWait

        self._user("triager", "view_deferredwork", "revive_deferredwork")
        with browser.chromium() as driver:
            self._log_in(driver, "triager")
            self._open_needs_attention(driver)

            rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
            assert len(rows) == 1  # the done row is not in "needs attention"
            assert f"#{self.abandoned.pk}" in rows[0].text
            assert "UpstreamError" in rows[0].text  # the exception type only
            assert "visit-4711" not in rows[0].text
            assert "HTTP 503" not in rows[0].text
            assert "abandoned" in rows[0].text
            assert "3 of 3" in rows[0].text
            driver.find_element(By.CSS_SELECTOR, f"input.action-select[value='{self.abandoned.pk}']").click()
            Select(driver.find_element(By.NAME, "action")).select_by_value("revive_selected")
            driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()

            message = WebDriverWait(driver, 10).until(
                ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success"))
            )
            assert message.text == "Revived 1 item; skipped none."
            # Back on "needs attention", which is now empty; the summary counts it pending.
            assert driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr") == []
            pending = driver.find_element(By.CSS_SELECTOR, ".nw-summary-item[data-status=pending]")
            assert pending.text.startswith("1")

            driver.get(
                f"{self.live_server_url}/admin/nexus_workflows/deferredwork/{self.abandoned.pk}/change/"
            )
            badge = driver.find_element(By.CSS_SELECTOR, ".field-status_column .nw-badge")
            assert badge.text == "pending"
            assert driver.find_elements(By.NAME, "revive") == []

        self.abandoned.refresh_from_db()
        assert self.abandoned.status == Status.PENDING
        assert self.abandoned.attempt == 0
        assert self.abandoned.checkpoints == {"summary_id": "S-88"}

    def test_no_revive_without_the_permission(self) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        self._user("watcher", "view_deferredwork", "change_deferredwork")
        with browser.chromium() as driver:
            self._log_in(driver, "watcher")
            self._open_needs_attention(driver)

            assert f"#{self.abandoned.pk}" in driver.find_element(By.ID, "result_list").text
            action_selects = driver.find_elements(By.NAME, "action")
            offered = (
                {option.get_attribute("value") for option in Select(action_selects[0]).options}
                if action_selects
                else set()
            )
            assert "revive_selected" not in offered
            assert "run_selected_now" not in offered

            driver.find_element(By.LINK_TEXT, f"#{self.abandoned.pk}").click()
            assert driver.find_elements(By.NAME, "revive") == []
            assert "permission" in driver.find_element(By.CSS_SELECTOR, ".nw-triage").text

        self.abandoned.refresh_from_db()
        assert self.abandoned.status == Status.ABANDONED

    def test_the_find_box_goes_to_the_work_of_a_key_that_is_in_no_url(self) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        self._user("watcher", "view_deferredwork")
        with browser.chromium() as driver:
            self._log_in(driver, "watcher")
            driver.get(f"{self.live_server_url}/admin/nexus_workflows/deferredwork/")
            box = driver.find_element(By.ID, "searchbar")
            box.send_keys("visit-4711")
            box.submit()
            change = f"/admin/nexus_workflows/deferredwork/{self.abandoned.pk}/change/"
            WebDriverWait(driver, 10).until(ec.url_contains(change))
            assert "4711" not in driver.current_url.replace(f"/{self.abandoned.pk}/", "/")
            assert driver.find_element(By.CSS_SELECTOR, ".field-status_column .nw-badge").text == "abandoned"

            # An unknown key: back on the list, told so, and the box is empty.
            driver.get(f"{self.live_server_url}/admin/nexus_workflows/deferredwork/")
            box = driver.find_element(By.ID, "searchbar")
            box.send_keys("visit-9999")
            box.submit()
            messages = (By.CSS_SELECTOR, ".messagelist")
            WebDriverWait(driver, 10).until(ec.presence_of_element_located(messages))
            assert "No deferred work has that dedupe key" in driver.find_element(*messages).text
            assert driver.find_element(By.ID, "searchbar").get_attribute("value") == ""
            assert "visit-9999" not in driver.page_source
            assert "visit-9999" not in driver.current_url
        finds = LogEntry.objects.filter(object_id=str(self.abandoned.pk))
        found = "Found by its dedupe key (nothing was changed)."
        assert [entry.get_change_message() for entry in finds] == [found]

    def test_dashboard_from_the_triage_panel(self) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        from nexus_workflows.observability import counts

        # Counts as a runner writes them, and a due item waiting since 20 minutes ago.
        batch = {(KIND, "done"): 7, (KIND, "rescheduled"): 2, (KIND, "abandoned"): 1}
        counts.add(batch, token="browser-test", using="default")
        DeferredWork.objects.create(
            kind=KIND,
            dedupe_key="visit-4713",
            trigger={"visit": 4713},
            next_attempt_at=timezone.now() - timedelta(minutes=20),
        )
        # And one a dead runner held: not heard from for 10 minutes (STALE_AFTER: 5 minutes).
        DeferredWork.objects.create(
            kind=KIND,
            dedupe_key="visit-4714",
            trigger={"visit": 4714},
            status=Status.PROCESSING,
            heartbeat_at=timezone.now() - timedelta(minutes=10),
        )
        self._user("watcher", "view_deferredwork", "view_runner")
        with browser.chromium() as driver:
            self._log_in(driver, "watcher")
            assert "0 runners alive" in driver.find_element(By.ID, "nw-runners").text
            driver.find_element(By.ID, "nw-dashboard").click()
            panel = (By.CSS_SELECTOR, f"section.nw-kind-panel[data-kind='{KIND}']")
            section = WebDriverWait(driver, 10).until(ec.presence_of_element_located(panel))
            text = section.text
            assert section.find_element(By.CSS_SELECTOR, ".nw-figure-pending").text == "1"
            assert "20 minutes overdue" in text  # the pending item waited longer than the stale claim
            stale = section.find_element(By.CSS_SELECTOR, ".nw-figure-stale")
            assert stale.text == "1"
            assert "STALE_AFTER" in stale.get_attribute("title")
            assert "7 done · 2 rescheduled · 1 abandoned" in text
            chart = section.find_element(By.CSS_SELECTOR, "svg.nw-chart")
            assert chart.size["width"] > 600
            assert chart.size["height"] > 100
            # The newest bucket holds the three outcomes, stacked.
            assert len(chart.find_elements(By.CSS_SELECTOR, "rect")) == 3
            assert "visit-4713" not in driver.page_source
            assert "visit-4714" not in driver.page_source
            driver.find_element(By.ID, "nw-dashboard-runners").click()
            WebDriverWait(driver, 10).until(ec.title_contains("Runners"))

    def test_reveal_from_the_detail_page(self) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        self._user("revealer", "view_deferredwork", "reveal_deferredwork")
        with browser.chromium() as driver:
            self._log_in(driver, "revealer")
            driver.get(
                f"{self.live_server_url}/admin/nexus_workflows/deferredwork/{self.abandoned.pk}/change/"
            )
            page = driver.find_element(By.ID, "content").text
            assert "visit-4711" not in page
            assert "HTTP 503" not in page
            driver.find_element(By.NAME, "reveal").click()
            WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".nw-reveal")))
            revealed = driver.find_element(By.ID, "content").text
            assert "visit-4711" in revealed
            assert "UpstreamError: HTTP 503" in revealed
            assert "S-88" in revealed  # the checkpoints
        entry = LogEntry.objects.get(object_id=str(self.abandoned.pk))
        assert entry.user.username == "revealer"

    def test_reveal_a_fire_and_forget_job_from_its_django_rq_page(self) -> None:
        import redis
        from django.conf import settings
        from rq import SimpleWorker
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        from nexus_workflows import enqueue
        from nexus_workflows.fire_and_forget import get_queue

        server = redis.Redis.from_url(settings.REDIS_TEST_URL)
        server.flushdb()  # the test database only (REDIS_TEST_URL), never FLUSHALL
        self.addCleanup(server.flushdb)
        job_id = enqueue("test-ff-fail", {"key": "br1", "secret": "Rosa Elena +525544332211"})
        queue = get_queue("default")
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:  # the worker installs its own signal handlers; the test runner gets its own back
            SimpleWorker([queue], connection=queue.connection).work(burst=True, logging_level="WARNING")
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        self._user("revealer", "view_deferredwork", "reveal_deferredwork")
        with browser.chromium() as driver:
            self._log_in(driver, "revealer")
            queue_index = sorted(settings.RQ_QUEUES).index("default")
            job_page = reverse("admin:django_rq_job_detail", args=[queue_index, job_id])
            driver.get(f"{self.live_server_url}{job_page}")
            page = driver.find_element(By.ID, "content").text
            assert "Rosa" not in page
            assert "5544332211" not in page
            reveal = queue.fetch_job(job_id).meta["reveal"]
            assert reveal in page  # the way to the reveal page, on the job's own page
            driver.get(f"{self.live_server_url}{reveal}")
            assert "Rosa" not in driver.find_element(By.ID, "content").text  # confirmation first
            driver.find_element(By.CSS_SELECTOR, ".nw-reveal input[type=submit]").click()
            WebDriverWait(driver, 10).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".nw-json")))
            revealed = driver.find_element(By.ID, "content").text
            assert "Rosa Elena +525544332211" in revealed  # the trigger
            assert "UpstreamRejected: upstream rejected the message for Rosa Elena" in revealed
        entry = LogEntry.objects.get(object_id=audit_id(job_id.split("__", 1)[0], job_id))
        assert entry.user.username == "revealer"

    def test_a_job_reveal_with_the_reveal_permission_alone_is_refused(self) -> None:
        """The job's reveal page asks for view on deferred work too, as a work item's does."""
        import redis
        from django.conf import settings
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        from nexus_workflows import enqueue
        from nexus_workflows.fire_and_forget import get_queue

        server = redis.Redis.from_url(settings.REDIS_TEST_URL)
        server.flushdb()  # the test database only (REDIS_TEST_URL), never FLUSHALL
        self.addCleanup(server.flushdb)
        job_id = enqueue("test-ff-ledger", {"key": "br2", "phone": "+525500112233"}, delay=3600)
        assert get_queue("default").fetch_job(job_id) is not None
        reveal = reverse("admin:nexus_workflows_deferredwork_job_reveal", args=["default", job_id])
        self._user("reveal-only", "reveal_deferredwork")
        with browser.chromium() as driver:
            driver.get(f"{self.live_server_url}/admin/login/?next=/admin/")
            driver.find_element(By.NAME, "username").send_keys("reveal-only")
            driver.find_element(By.NAME, "password").send_keys(PASSWORD)
            driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
            WebDriverWait(driver, 10).until(lambda d: "/login/" not in d.current_url)
            driver.get(f"{self.live_server_url}{reveal}")
            body = driver.find_element(By.TAG_NAME, "body").text
            assert "403" in body or "Forbidden" in body, body[:200]
            assert "+525500112233" not in body
            assert not driver.find_elements(By.CSS_SELECTOR, ".nw-reveal input[type=submit]")
        assert not LogEntry.objects.exists()
