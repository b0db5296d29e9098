"""A list filter's value that no column can hold (a NUL character) in the admin's URL was a
500 on PostgreSQL, which refuses even to compare with it (Django's field filter passes it
to the query). Now every list of the app answers with Django's "invalid filter" redirect
(``?e=1``), as for other bad lookups, and the page it leads to renders."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.admin.conftest import client_for

pytestmark = pytest.mark.postgresql


@pytest.mark.parametrize(
    ("url_name", "parameter"),
    [
        ("admin:nexus_workflows_deferredwork_changelist", "kind"),
        ("admin:nexus_workflows_deferredwork_changelist", "kind__exact"),
        ("admin:nexus_workflows_deferredwork_changelist", "status"),
        ("admin:nexus_workflows_deferredwork_changelist", "flow"),
        ("admin:nexus_workflows_phitoken_changelist", "category"),
        ("admin:nexus_workflows_phitoken_changelist", "category__exact"),
    ],
)
def test_a_nul_character_in_a_list_filter_is_an_invalid_filter_not_a_server_error(
    superuser, make_work, url_name, parameter
):
    make_work()
    url = reverse(url_name)
    client = client_for(superuser)

    response = client.get(url, {parameter: "visit\x00summary"})

    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")
    assert client.get(f"{url}?e=1").status_code == 200


def test_the_find_box_refuses_list_filters_with_a_nul_character(superuser, make_work):
    """The find box POSTs the list's filters too, and they go through the same list: refused
    as a filter the list does not offer is (400), where the find's query was a 500."""
    work = make_work()

    response = client_for(superuser).post(
        reverse("admin:nexus_workflows_deferredwork_find"),
        {"key": work.dedupe_key, "_changelist_filters": "kind=visit%00summary"},
    )

    assert response.status_code == 400
