from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from nexus_workflows.phi import encode
from nexus_workflows.phi.models import PhiToken, TokenMap

pytestmark = pytest.mark.django_db

VALUES = [("María López", "PERSONA"), ("55 1234 5678", "TELEFONO"), ("maria@example.com", "EMAIL")]
PLAINTEXT = ["María López", "maria lopez", "1234 5678", "5512345678", "maria@example.com", "maria@"]


def staff_client(*codenames: str) -> Client:
    user = User.objects.create_user(f"staff-{len(codenames)}", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


VIEWER = ("view_tokenmap", "view_phitoken")
REVEALER = (*VIEWER, "reveal_phitoken")


@pytest.fixture
def tokens(code: str) -> list[str]:
    return [encode(code, value, category) for value, category in VALUES]


def assert_no_plaintext(html: str, *extra: str) -> None:
    for text in (*PLAINTEXT, *extra):
        assert text not in html


def test_maps_are_listed_by_id_with_token_count_and_sequence_never_the_code(
    code: str, tokens: list[str]
) -> None:
    token_map = TokenMap.objects.for_code(code).get()
    TokenMap.objects.filter(pk=token_map.pk).update(sequence=7)  # a gap left by a deleted token, say
    response = staff_client(*VIEWER).get(reverse("admin:nexus_workflows_tokenmap_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"token map #{token_map.pk}" in html
    assert code not in html
    assert '<td class="field-token_count">3</td>' in html
    assert '<td class="field-sequence">7</td>' in html
    assert_no_plaintext(html)


def test_a_code_in_a_list_url_finds_nothing_and_is_never_echoed(code: str, tokens: list[str]) -> None:
    """A code in a GET URL would reach access logs and browser history: the lists do not
    search by code (the maps page's box POSTs it, below), and a typed ?q= is not echoed."""
    client = staff_client(*VIEWER)
    for name in ("tokenmap", "phitoken"):
        url = reverse(f"admin:nexus_workflows_{name}_changelist")
        response = client.get(url, {"q": code, "o": "1"})
        assert response.status_code == 200
        assert response.context["cl"].result_count == 0
        assert code not in response.content.decode()  # not in the search box, nor in any link
    # A change page reached with a search in its filters does not carry the code on.
    change = reverse("admin:nexus_workflows_tokenmap_change", args=[TokenMap.objects.for_code(code).get().pk])
    page = client.get(change, {"_changelist_filters": f"q={code}&o=1"}).content.decode()
    assert code not in page


def test_tokens_list_shows_token_and_category_never_the_surface(code: str, tokens: list[str]) -> None:
    ciphertexts = list(PhiToken.objects.values_list("encrypted_surface", flat=True))
    response = staff_client(*VIEWER).get(reverse("admin:nexus_workflows_phitoken_changelist"))
    html = response.content.decode()
    for token in tokens:
        assert token.replace("<", "&lt;").replace(">", "&gt;") in html
    for category in ("PERSONA", "TELEFONO", "EMAIL"):
        assert category in html
    assert_no_plaintext(html, *ciphertexts)


@pytest.mark.parametrize("query", ["María", "maria", "López", "5512345678", "example.com"])
def test_surfaces_are_not_searchable(code: str, tokens: list[str], query: str) -> None:
    client = staff_client(*VIEWER)
    for name in ("phitoken", "tokenmap"):
        response = client.get(reverse(f"admin:nexus_workflows_{name}_changelist"), {"q": query})
        assert response.status_code == 200
        assert response.context["cl"].result_count == 0
    # Search by token does work.
    response = client.get(reverse("admin:nexus_workflows_phitoken_changelist"), {"q": tokens[0]})
    assert response.context["cl"].result_count == 1


def test_map_and_token_pages_never_show_the_surface(code: str, tokens: list[str]) -> None:
    client = staff_client(*VIEWER)
    token_map = TokenMap.objects.for_code(code).get()
    html = client.get(reverse("admin:nexus_workflows_tokenmap_change", args=[token_map.pk])).content.decode()
    assert "&lt;&lt;PERSONA_1&gt;&gt;" in html
    assert_no_plaintext(html)
    token = PhiToken.objects.get(token=tokens[0])
    html = client.get(reverse("admin:nexus_workflows_phitoken_change", args=[token.pk])).content.decode()
    assert "PERSONA" in html
    assert "Reveal surface" not in html  # no permission, no button
    assert_no_plaintext(html, token.encrypted_surface, token.lookup_key)


def test_revealing_needs_the_dedicated_permission(code: str, tokens: list[str]) -> None:
    token = PhiToken.objects.get(token=tokens[0])
    url = reverse("admin:nexus_workflows_phitoken_reveal", args=[token.pk])
    client = staff_client(*VIEWER)
    assert client.get(url).status_code == 403
    response = client.post(url)
    assert response.status_code == 403
    assert_no_plaintext(response.content.decode())
    assert not LogEntry.objects.exists()


def test_reveal_shows_the_surface_after_a_post_and_logs_it(code: str, tokens: list[str]) -> None:
    token = PhiToken.objects.get(token=tokens[0])
    client = staff_client(*REVEALER)
    change = client.get(reverse("admin:nexus_workflows_phitoken_change", args=[token.pk])).content.decode()
    url = reverse("admin:nexus_workflows_phitoken_reveal", args=[token.pk])
    assert url in change

    confirm = client.get(url)
    assert confirm.status_code == 200
    assert_no_plaintext(confirm.content.decode())
    assert not LogEntry.objects.exists()  # looking at the confirmation reveals nothing

    revealed = client.post(url)
    assert revealed.status_code == 200
    assert "María López" in revealed.content.decode()
    assert "no-cache" in revealed["Cache-Control"]
    entry = LogEntry.objects.get()
    assert entry.object_id == str(token.pk)
    assert entry.user.username == "staff-3"
    assert "Revealed the surface of <<PERSONA_1>>" in entry.get_change_message()
    assert_no_plaintext(entry.change_message + entry.object_repr, code)
    assert "no-store" in revealed["Cache-Control"]

    history = client.get(reverse("admin:nexus_workflows_phitoken_history", args=[token.pk]))
    assert "Revealed the surface" in history.content.decode()
    assert_no_plaintext(history.content.decode())


def test_maps_and_tokens_cannot_be_added_edited_or_deleted_in_the_admin(code: str, tokens: list[str]) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    assert client.get(reverse("admin:nexus_workflows_tokenmap_add")).status_code == 403
    assert client.get(reverse("admin:nexus_workflows_phitoken_add")).status_code == 403
    token = PhiToken.objects.get(token=tokens[0])
    before = token.encrypted_surface
    client.post(reverse("admin:nexus_workflows_phitoken_change", args=[token.pk]), {"token": "<<ID_9>>"})
    token.refresh_from_db()
    assert (token.token, token.encrypted_surface) == (tokens[0], before)
    assert client.get(reverse("admin:nexus_workflows_phitoken_delete", args=[token.pk])).status_code == 403
    token_map = TokenMap.objects.for_code(code).get()
    delete = reverse("admin:nexus_workflows_tokenmap_delete", args=[token_map.pk])
    assert client.get(delete).status_code == 403
    assert client.post(delete).status_code == 403
    changelist = reverse("admin:nexus_workflows_tokenmap_changelist")
    assert "delete_selected" not in client.get(changelist).content.decode()
    client.post(changelist, {"action": "delete_selected", "_selected_action": [token_map.pk], "post": "yes"})
    assert TokenMap.objects.filter(pk=token_map.pk).exists()
    assert PhiToken.objects.filter(token_map=token_map).count() == 3


def test_the_search_box_posts_the_code_so_no_url_carries_it(code: str, tokens: list[str]) -> None:
    client = staff_client(*VIEWER)
    changelist = client.get(reverse("admin:nexus_workflows_tokenmap_changelist")).content.decode()
    find = reverse("admin:nexus_workflows_tokenmap_find")
    assert f'method="post" action="{find}"' in changelist
    assert client.get(find).status_code == 405

    found = client.post(find, {"code": code})
    token_map = TokenMap.objects.for_code(code).get()
    assert found.status_code == 302
    assert found["Location"] == reverse("admin:nexus_workflows_tokenmap_change", args=[token_map.pk])
    page = client.get(found["Location"]).content.decode()
    assert code not in page
    assert "&lt;&lt;PERSONA_1&gt;&gt;" in page  # its tokens

    # Whether a code has a conversation is patient data: each find is audited, without the code.
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.user.username) == (str(token_map.pk), "staff-2")
    assert entry.get_change_message() == "Found by its conversation code (nothing was changed)."
    assert code not in f"{entry.object_repr} {entry.change_message}"

    # Parts of a code, or another spelling, find nothing (only hashes are stored). A miss
    # is audited too, on the model and without the code: that a number has no conversation
    # is also an answer about a person, and repeated misses are what probing looks like.
    nears = (code[:-1], code.upper(), f" {code}", code[5:])
    for near in nears:
        missing = client.post(find, {"code": near}, follow=True)
        assert missing.redirect_chain[-1][0] == reverse("admin:nexus_workflows_tokenmap_changelist")
        assert "No token map has that conversation code." in missing.content.decode()
        assert near not in missing.content.decode()
    misses = LogEntry.objects.exclude(pk=entry.pk)
    assert misses.count() == len(nears)
    for miss in misses:
        assert (miss.object_id, miss.user.username, miss.content_type.model) == (None, "staff-2", "tokenmap")
        assert miss.get_change_message() == (
            "Looked for by a conversation code that no map has (nothing was changed)."
        )
        assert not any(near in f"{miss.object_repr} {miss.change_message}" for near in nears)
    client.post(find, {"code": ""})  # an empty box looks for nothing
    assert LogEntry.objects.count() == 1 + len(nears)


def test_finding_a_map_needs_the_view_permission(code: str, tokens: list[str]) -> None:
    client = staff_client("view_phitoken")
    assert client.post(reverse("admin:nexus_workflows_tokenmap_find"), {"code": code}).status_code == 403


@pytest.mark.parametrize("name", ["phitoken", "tokenmap"])
def test_lists_filter_only_by_what_they_offer(code: str, tokens: list[str], name: str) -> None:
    """Any other field in the URL (a hash, a ciphertext, a date) is refused, as on the
    deferred-work list, where it would answer guesses about patient data."""
    client = staff_client(*VIEWER)
    url = reverse(f"admin:nexus_workflows_{name}_changelist")
    for lookup in ("encrypted_surface__isnull", "lookup_key__startswith", "code_hash__startswith", "id__gt"):
        assert client.get(url, {lookup: "a"}).status_code == 400
    if name == "phitoken":
        assert client.get(url, {"category__exact": "PERSONA"}).context["cl"].result_count == 1
