from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from nexus_workflows.phi import (
    InvalidCategory,
    InvalidCode,
    InvalidPhiValue,
    InvalidSpan,
    InvalidText,
    PhiError,
    decode,
    encode,
    encode_text,
    find_spans,
)
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.models import PhiToken, TokenMap
from tests.processes import url_of_test_database
from tests.threads import run_together

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def stored_surface(code: str, token: str) -> str:
    token_cache.clear()  # read what is stored, not what this process remembers
    return decode(code, token)


def test_same_value_same_token_new_value_next_number(code: str) -> None:
    first = encode(code, "maria lopez", "PERSONA")
    assert first == "<<PERSONA_1>>"
    assert encode(code, "  MARÍA   López ", "PERSONA") == first
    # One sequence per code, shared by every category.
    assert encode(code, "55 1234 5678", "TELEFONO") == "<<TELEFONO_2>>"
    assert encode(code, "+52 55 1234 5678", "TELEFONO") == "<<TELEFONO_2>>"
    assert encode(code, "(55) 1234-5678", "TELEFONO") == "<<TELEFONO_2>>"
    assert encode(code, "Maria.Lopez@example.com", "EMAIL") == "<<EMAIL_3>>"
    assert encode(code, "abc-123", "ID") == "<<ID_4>>"
    assert encode(code, "Mario Lopez", "PERSONA") == "<<PERSONA_5>>"
    assert TokenMap.objects.for_code(code).get().sequence == 5
    assert PhiToken.objects.filter(token_map__in=TokenMap.objects.for_code(code)).count() == 5


def test_tokens_are_stable_after_the_cache_is_gone(code: str) -> None:
    token = encode(code, "María López", "PERSONA")
    token_cache.clear()
    assert encode(code, "maria lopez", "PERSONA") == token


def test_same_value_in_two_codes_is_two_tokens_in_two_maps(code: str) -> None:
    other = code + "-other"
    assert encode(code, "María López", "PERSONA") == "<<PERSONA_1>>"
    encode(other, "Someone Else", "PERSONA")
    assert encode(other, "María López", "PERSONA") == "<<PERSONA_2>>"
    lookup_keys = set(PhiToken.objects.values_list("lookup_key", flat=True))
    assert len(lookup_keys) == 3  # the code is part of the HMAC: no linking across conversations


def test_same_normalised_text_in_two_categories_is_two_values(code: str) -> None:
    assert encode(code, "12345678", "ID") != encode(code, "12345678", "PERSONA")


def test_numbers_are_accepted_as_values(code: str) -> None:
    token = encode(code, 5512345678, "TELEFONO")
    assert encode(code, "55 1234 5678", "TELEFONO") == token
    assert encode(code, 987654, "ID") == encode(code, "987-654", "ID")


def test_decode_replaces_whole_tokens_of_that_code_only(code: str) -> None:
    names = [f"Persona {n} Apellido" for n in range(1, 11)]
    tokens = [encode(code, name, "PERSONA") for name in names]
    assert tokens[0] == "<<PERSONA_1>>"
    assert tokens[9] == "<<PERSONA_10>>"
    text = (
        "<<PERSONA_10>> y <<PERSONA_1>>, <<PERSONA_1>>> <<PERSONA_11>> <<EMAIL_1>> <<PERSONA_01>> <PERSONA_1>"
    )
    assert decode(code, text) == (
        "Persona 10 Apellido y Persona 1 Apellido, Persona 1 Apellido> <<PERSONA_11>> <<EMAIL_1>> "
        "<<PERSONA_01>> <PERSONA_1>"
    )
    # Another code's tokens are unknown here, and an unknown code decodes nothing.
    assert decode(code + "-x", "<<PERSONA_1>>") == "<<PERSONA_1>>"
    assert decode(code, "no tokens here") == "no tokens here"


def test_decode_writes_nothing_for_an_unknown_code(code: str) -> None:
    decode(code, "<<PERSONA_1>>")
    assert not TokenMap.objects.for_code(code).exists()


def test_surface_upgrade_only_towards_richer(code: str) -> None:
    token = encode(code, "maria lopez", "PERSONA")
    assert stored_surface(code, token) == "maria lopez"
    encode(code, "MARÍA LÓPEZ", "PERSONA")  # accents beat none
    assert stored_surface(code, token) == "MARÍA LÓPEZ"
    encode(code, "María López", "PERSONA")  # same accents, mixed case beats all-upper
    assert stored_surface(code, token) == "María López"
    for poorer in ("maria lopez", "MARIA LOPEZ", "María Lopez", "maría lópez"):
        encode(code, poorer, "PERSONA")
        assert stored_surface(code, token) == "María López"
    assert decode(code, f"Hola {token}") == "Hola María López"


def test_upgrade_is_seen_by_this_process_at_once(code: str) -> None:
    token = encode(code, "jose nunez", "PERSONA")
    assert decode(code, token) == "jose nunez"
    encode(code, "José Núñez", "PERSONA")
    assert decode(code, token) == "José Núñez"


def test_repeat_encode_served_from_the_cache_makes_no_query(
    code: str, django_assert_num_queries: Callable[..., Any]
) -> None:
    token = encode(code, "María López", "PERSONA")
    phone = encode(code, "55 1234 5678", "TELEFONO")
    with django_assert_num_queries(0):
        assert encode(code, "María López", "PERSONA") == token
        assert encode(code, "maria lopez", "PERSONA") == token  # another, poorer spelling
        assert encode(code, "5512345678", "TELEFONO") == phone  # shorter: not richer
        assert decode(code, f"{token} {phone}") == "María López 55 1234 5678"


def test_first_encode_of_a_known_code_loads_it_with_one_query(
    code: str, django_assert_num_queries: Callable[..., Any]
) -> None:
    token = encode(code, "María López", "PERSONA")
    encode(code, "55 1234 5678", "TELEFONO")
    token_cache.clear()
    with django_assert_num_queries(1):
        assert encode(code, "María López", "PERSONA") == token


def test_a_stale_cache_never_gives_a_second_token(code: str) -> None:
    """Another process allocated values after this one cached the map."""
    encode(code, "Ana Ruiz", "PERSONA")
    stale = token_cache.peek(("default", code))
    assert stale is not None
    token_cache.clear()
    other = encode(code, "Beto Ruiz", "PERSONA")  # "elsewhere": this process's cache is stale
    token_cache._store(("default", code), stale)
    assert encode(code, "beto ruiz", "PERSONA") == other
    assert decode(code, other) == "Beto Ruiz"
    assert encode(code, "Carla Ruiz", "PERSONA") == "<<PERSONA_3>>"  # the sequence moved on
    assert PhiToken.objects.filter(token_map__in=TokenMap.objects.for_code(code)).count() == 3


def test_upgrade_against_a_stale_surface_compares_with_the_stored_one(code: str) -> None:
    token = encode(code, "maria lopez", "PERSONA")
    stale = token_cache.peek(("default", code))
    token_cache.clear()
    encode(code, "María López", "PERSONA")  # "elsewhere"
    token_cache._store(("default", code), stale)
    encode(code, "MARÍA LÓPEZ", "PERSONA")  # richer than the stale surface, poorer than the stored
    assert stored_surface(code, token) == "María López"


@pytest.mark.django_db(transaction=True)
def test_concurrent_loads_of_one_code_share_one_query(code: str) -> None:
    token = encode(code, "María López", "PERSONA")
    token_cache.clear()
    loads_before = token_cache.loads

    def slow_map_queries(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        # Widen the window in which the other threads arrive while a load is running.
        if "nexus_workflows_tokenmap" in sql:
            threading.Event().wait(0.2)
        return execute(sql, params, many, context)

    def worker(_: int) -> tuple[str, int]:
        with connection.execute_wrapper(slow_map_queries), CaptureQueriesContext(connection) as queries:
            result = encode(code, "maria lopez", "PERSONA")
        return result, len(queries)

    results, query_counts = zip(*run_together(worker, 8), strict=True)
    assert results == (token,) * 8
    assert sum(query_counts) == 1
    assert token_cache.loads - loads_before == 1


def test_a_rolled_back_encode_leaves_nothing_behind(code: str) -> None:
    kept = encode(code, "Ana Ruiz", "PERSONA")

    class Rollback(Exception):
        pass

    seen: list[str] = []

    def encode_then_fail() -> None:
        with transaction.atomic():
            seen.append(encode(code, "Beto Ruiz", "PERSONA"))
            seen.append(decode(code, seen[0]))
            raise Rollback

    with pytest.raises(Rollback):
        encode_then_fail()
    rolled_back, decoded = seen
    assert decoded == "Beto Ruiz"  # inside its transaction the new token was known
    # The cache must not remember the rolled-back token: the value is new again.
    assert PhiToken.objects.filter(token_map__in=TokenMap.objects.for_code(code)).count() == 1
    again = encode(code, "Beto Ruiz", "PERSONA")
    assert again == rolled_back  # the sequence rolled back too, so no gap
    assert PhiToken.objects.filter(token_map__in=TokenMap.objects.for_code(code), token=again).exists()
    assert decode(code, f"{kept} {again}") == "Ana Ruiz Beto Ruiz"


def encode_in_another_process(code: str, value: str) -> str:
    script = "import django; django.setup(); import sys; from nexus_workflows.phi import encode; "
    script += "print(encode(sys.argv[1], sys.argv[2], 'PERSONA'))"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": url_of_test_database(),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-c", script, code, value]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


# Django's documentation: with autocommit off, sqlite3 commits before a savepoint, so
# atomic() (which every write uses) cannot roll anything back there.
@pytest.mark.needs("autocommit_off_rollback")
@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_encode_under_manual_transaction_management_is_not_cached(code: str) -> None:
    # transaction.set_autocommit(False): no atomic block, so no on_commit says whether
    # the token will be committed. The cache kept it, and after the rollback this process
    # still decoded <<PERSONA_1>> as Ana once another process had given it to Beto.
    transaction.set_autocommit(False)
    try:
        assert encode(code, "Ana Ruiz", "PERSONA") == "<<PERSONA_1>>"
        assert encode(code, "ana ruiz", "PERSONA") == "<<PERSONA_1>>"  # its transaction sees it
        assert decode(code, "<<PERSONA_1>>") == "Ana Ruiz"
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert encode_in_another_process(code, "Beto Ruiz") == "<<PERSONA_1>>"
    assert decode(code, "<<PERSONA_1>>") == "Beto Ruiz"
    assert encode(code, "Ana Ruiz", "PERSONA") == "<<PERSONA_2>>"
    # Committed, the tokens are cached as usual.
    transaction.set_autocommit(False)
    try:
        assert encode(code, "Cris Ruiz", "PERSONA") == "<<PERSONA_3>>"
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert decode(code, "<<PERSONA_1>> <<PERSONA_2>> <<PERSONA_3>>") == "Beto Ruiz Ana Ruiz Cris Ruiz"


def test_encode_inside_a_committed_transaction(code: str) -> None:
    with transaction.atomic():
        token = encode(code, "Ana Ruiz", "PERSONA")
        assert encode(code, "ana ruiz", "PERSONA") == token
    assert encode(code, "ANA RUIZ", "PERSONA") == token
    assert decode(code, token) == "Ana Ruiz"


def test_encode_text_finds_emails_and_phones_and_takes_spans(code: str) -> None:
    text = "Soy María López, escríbeme a Maria.Lopez@Example.com o llama al (55) 1234-5678. CURP LOMA-800101."
    name = (text.index("María"), text.index("María") + len("María López"), "PERSONA")
    curp = (text.index("LOMA"), text.index("LOMA") + len("LOMA-800101"), "ID")
    encoded = encode_text(code, text, spans=[curp, name])
    assert encoded == ("Soy <<PERSONA_1>>, escríbeme a <<EMAIL_2>> o llama al <<TELEFONO_3>>. CURP <<ID_4>>.")
    assert decode(code, encoded) == text
    # The same values in another message get the same tokens.
    message = "maria lopez: 55 1234 5678, maria.lopez@example.com"
    again = encode_text(code, message, spans=[(0, 11, "PERSONA")])
    assert again == "<<PERSONA_1>>: <<TELEFONO_3>>, <<EMAIL_2>>"


def test_encode_text_caller_spans_win_over_detection(code: str) -> None:
    text = "ID 5512345678 and mail a5512345678@x.com"
    encoded = encode_text(code, text, spans=[(3, 13, "ID")])
    assert encoded == "ID <<ID_1>> and mail <<EMAIL_2>>"


def test_encode_text_the_issues_messages_in_one_conversation(code: str) -> None:
    messages = [
        ("La receta dice 044 55 1234 5678", "La receta dice <<TELEFONO_1>>"),
        ("whatsapp 1 55 1234 5678", "whatsapp <<TELEFONO_1>>"),
        ("mi correo es maria arroba gmail punto com", "mi correo es <<EMAIL_2>>"),
        ("CURP LOMA800101MDFPRR09 y RFC LOMA800101AB1", "CURP <<ID_3>> y RFC <<ID_4>>"),
        # Other spellings of the same values get the same tokens.
        ("o al (55) 12-34-56-78, Maria@Gmail.com", "o al <<TELEFONO_1>>, <<EMAIL_2>>"),
        ("+52 1 55 1234 5678 / maria(at)gmail(dot)com", "<<TELEFONO_1>> / <<EMAIL_2>>"),
        ("curp: loma800101mdfprr09", "curp: <<ID_3>>"),
    ]
    for message, encoded in messages:
        assert encode_text(code, message) == encoded
    assert encode(code, "maria @ gmail . com", "EMAIL") == "<<EMAIL_2>>"
    assert encode(code, "045 55 1234 5678", "TELEFONO") == "<<TELEFONO_1>>"


@pytest.mark.parametrize(
    "message",
    [
        "La receta dice 044 55 1234 5678",
        "mi cel 55\u00a01234\u00a05678 (pegado de WhatsApp)",
        "número: \uff15\uff15 \uff11\uff12\uff13\uff14 \uff15\uff16\uff17\uff18",
        "correo MARIA  arroba  GMAIL  punto  com y tel 55  1234  5678",
        "datos:\nCURP loma800101mdfprr09\nNSS 12-34-56-7890-3\nRFC LOMA800101AB1 🙏",
    ],
)
def test_decode_gives_back_exactly_what_encode_text_replaced(code: str, message: str) -> None:
    encoded = encode_text(code, message)
    assert "<<" in encoded
    assert decode(code, encoded) == message


def test_encode_text_without_phi_is_unchanged_and_writes_nothing(code: str) -> None:
    assert encode_text(code, "hola, ¿cómo estás?") == "hola, ¿cómo estás?"
    assert not TokenMap.objects.for_code(code).exists()


@pytest.mark.parametrize(
    ("call", "error", "rule"),
    [
        (lambda c: encode(c, "María", "NAME"), InvalidCategory, "allowed: PERSONA, TELEFONO, EMAIL, ID"),
        # Value and category swapped: the name lands where the category goes.
        (lambda c: encode(c, "PERSONA", "María López"), InvalidCategory, "allowed"),
        (lambda c: encode(c, None, "PERSONA"), InvalidPhiValue, "None"),
        (lambda c: encode(c, "", "PERSONA"), InvalidPhiValue, "empty"),
        (lambda c: encode(c, "  ", "EMAIL"), InvalidPhiValue, "empty"),
        (lambda c: encode(c, "-- / --", "ID"), InvalidPhiValue, "normalises to nothing"),
        (lambda c: encode(c, "call me", "TELEFONO"), InvalidPhiValue, "not a phone number"),
        (lambda c: encode("", "María", "PERSONA"), InvalidCode, "non-empty string"),
        (lambda c: encode("   ", "María", "PERSONA"), InvalidCode, "non-empty string"),
        (lambda c: encode(None, "María", "PERSONA"), InvalidCode, "non-empty string"),
        (lambda c: encode("x" * 256, "María", "PERSONA"), InvalidCode, "at most 255"),
        (lambda c: decode("", "<<PERSONA_1>>"), InvalidCode, "non-empty string"),
        (lambda c: decode(c, None), InvalidText, "string"),
        (lambda c: encode_text(c, None), InvalidText, "string"),
        (
            lambda c: encode_text(c, "María 55 1234 5678", spans=[(0, 99, "PERSONA")]),
            InvalidSpan,
            "0 <= start",
        ),
        (
            lambda c: encode_text(c, "María López", spans=[(0, 5, "PERSONA"), (3, 11, "PERSONA")]),
            InvalidSpan,
            "overlap",
        ),
        (lambda c: encode_text(c, "María López", spans=[(0, 5)]), InvalidSpan, "(start, end, category)"),
        # Spans that are no list of tuples, bounds beyond any text (TypeError, ValueError before).
        (lambda c: encode_text(c, "María López", spans=5), InvalidSpan, "list of (start, end, category)"),
        (lambda c: encode_text(c, "María López", spans=True), InvalidSpan, "list of (start, end, category)"),
        (
            lambda c: encode_text(c, "María López", spans=[(0, 10**5000, "PERSONA")]),
            InvalidSpan,
            "0 <= start",
        ),
        (lambda c: find_spans(None), InvalidText, "find_spans needs the text as a string; got NoneType"),
        (lambda c: find_spans(b"55 1234 5678"), InvalidText, "string; got bytes"),
        (lambda c: find_spans(5512345678), InvalidText, "string; got int"),
        (lambda c: find_spans("María López", spans=7), InvalidSpan, "list of (start, end, category)"),
        (lambda c: encode_text(c, "María López", spans=[(0, 5, "NAME")]), InvalidCategory, "allowed"),
        (lambda c: encode_text(c, "María López", spans=[(0, 5, "López")]), InvalidCategory, "allowed"),
        # A bad span after a good one and a detectable phone: nothing at all is written.
        (
            lambda c: encode_text(c, "María, 55 1234 5678, --", spans=[(0, 5, "PERSONA"), (21, 23, "ID")]),
            InvalidPhiValue,
            "normalises to nothing",
        ),
    ],
)
def test_bad_input_raises_a_specific_error_and_writes_nothing(
    code: str, call: Callable[[str], Any], error: type[PhiError], rule: str
) -> None:
    with pytest.raises(error) as raised:
        call(code)
    message = str(raised.value)
    assert rule in message
    for value in ("María", "López", "5512345678", "55 1234 5678", "call me"):
        assert value not in message
    assert TokenMap.objects.count() == 0
    assert PhiToken.objects.count() == 0


def test_no_value_surface_or_normalised_form_in_logs(code: str, phi_log: pytest.LogCaptureFixture) -> None:
    values = [
        ("María López", "PERSONA"),
        ("maria lopez", "PERSONA"),
        ("55 1234 5678", "TELEFONO"),
        ("Maria.Lopez@Example.com", "EMAIL"),
        ("LOMA-800101", "ID"),
    ]
    tokens = [encode(code, value, category) for value, category in values]
    token_cache.clear()
    encode(code, "MARÍA LÓPEZ", "PERSONA")
    encode(code, "Someone Nuevo", "PERSONA")
    decode(code, " ".join(tokens))
    encode_text(code, "Hola María López, 55 1234 5678", spans=[(5, 16, "PERSONA")])
    assert "allocated <<PERSONA_1>>" in phi_log.text  # the log is captured at all
    forbidden = [
        "María", "maria", "MARÍA", "López", "lopez", "5512345678", "1234 5678", "1234",
        "Maria.Lopez", "maria.lopez", "LOMA", "800101", "Someone", "Nuevo", code,
    ]  # fmt: skip
    for text in forbidden:
        assert text.lower() not in phi_log.text.lower()


def test_a_sequence_behind_its_tokens_is_repaired(code: str) -> None:
    first = encode(code, "Ana Ruiz", "PERSONA")
    second = encode(code, "Beto Ruiz", "PERSONA")
    TokenMap.objects.for_code(code).update(sequence=0)  # edited by hand, say
    token_cache.clear()
    assert encode(code, "Carla Ruiz", "PERSONA") == "<<PERSONA_3>>"
    assert TokenMap.objects.for_code(code).get().sequence == 3
    assert decode(code, f"{first} {second} <<PERSONA_3>>") == "Ana Ruiz Beto Ruiz Carla Ruiz"


@pytest.mark.django_db(transaction=True)
def test_a_map_deleted_while_cached_is_made_again(code: str) -> None:
    encode(code, "Ana Ruiz", "PERSONA")
    TokenMap.objects.for_code(code).delete()  # an operator forgets the conversation
    token = encode(code, "Beto Ruiz", "PERSONA")  # this process still has the old map cached
    assert token == "<<PERSONA_1>>"
    token_map = TokenMap.objects.for_code(code).get()
    assert list(token_map.tokens.values_list("token", flat=True)) == ["<<PERSONA_1>>"]
    token_cache.clear()
    assert decode(code, token) == "Beto Ruiz"


def test_a_value_allocated_elsewhere_before_the_map_was_cached_here(code: str) -> None:
    """This process saw no map at all; another made it and allocated the value."""
    encode(code + "-warmup", "x x", "PERSONA")
    assert decode(code, "<<PERSONA_1>>") == "<<PERSONA_1>>"  # caches "no map" for code
    stale = token_cache.peek(("default", code))
    token_cache.clear()
    token = encode(code, "Ana Ruiz", "PERSONA")  # "elsewhere"
    token_cache._store(("default", code), stale)  # type: ignore[arg-type]
    assert encode(code, "ana ruiz", "PERSONA") == token
    assert encode(code, "Beto Ruiz", "PERSONA") == "<<PERSONA_2>>"
