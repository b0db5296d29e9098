"""A runner's metrics endpoint during an outage: Prometheus keeps scraping (every 15 s, often
from two servers), and each scrape that finds no database must not add a WARNING line of its
own. One line when the database's figures go missing, one when they are back, and one again
for the next outage (a real ``runworkflows --metrics-port`` process behind a TCP proxy)."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import ManagePy, url_of_test_database, wait_for
from tests.tcp_proxy import TcpProxy

# A database server behind a TCP proxy: SQLite has none to cut.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.needs("server")]

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 60, "SHUTDOWN_GRACE": 1}
MISSING = "metrics: the database did not answer"
BACK = "metrics: the database's figures are served again"


def has_database_figures(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return any(family.name == "nexus_workflows_runners" for family in text_string_to_metric_families(text))


def test_scrapes_during_an_outage_log_it_once_and_its_end_once() -> None:
    from django.db import connection

    settings = connection.settings_dict
    proxy = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    proxy.start()
    process = ManagePy(
        "runworkflows",
        "--kind",
        "test-ledger",
        "--metrics-port",
        "0",
        settings=FAST,
        database_url=url_of_test_database(port=proxy.port),
    )
    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        assert has_database_figures(port)
        for _outage in range(2):
            proxy.cut()
            wait_for(lambda: not has_database_figures(port), timeout=30, what="a scrape without the database")
            assert not any(has_database_figures(port) for _ in range(5))  # five more scrapes in the outage
            proxy.restore()
            wait_for(lambda: has_database_figures(port), timeout=30, what="the database's figures again")
        assert process.terminate() == 0, process.output()
        output = process.output()
    finally:
        proxy.close()
        process.close()
    assert output.count(MISSING) == 2, output
    assert output.count(BACK) == 2, output
