"""Migration 0006 turns stored conversation codes into keyed hashes, and maps keep working."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.exceptions import IrreversibleError
from django.db.migrations.executor import MigrationExecutor

from nexus_workflows.phi import decode, encode
from nexus_workflows.phi.keys import code_hash, keyring
from nexus_workflows.phi.models import TokenMap
from nexus_workflows.phi.normalization import normalize

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("nexus_workflows", "0005_runner_wakeup_mode")
AFTER = ("nexus_workflows", "0006_minimum_necessary")
CODE = "whatsapp:+5215573914862"


def migrate(target: tuple[str, str]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    return MigrationExecutor(connection)


@pytest.fixture
def at_0002() -> Iterator[MigrationExecutor]:
    executor = migrate(BEFORE)
    try:
        yield executor
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _columns() -> set[str]:
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, TokenMap._meta.db_table)
    return {column.name for column in description}


def test_existing_codes_become_keyed_hashes_and_their_tokens_still_decode(
    at_0002: MigrationExecutor,
) -> None:
    apps = at_0002.loader.project_state([BEFORE]).apps
    OldMap = apps.get_model("nexus_workflows", "TokenMap")
    OldToken = apps.get_model("nexus_workflows", "PhiToken")
    ring = keyring()
    old_map = OldMap.objects.create(code=CODE, sequence=1)
    lookup_key = ring.lookup_key(CODE, "PERSONA", normalize("María López", "PERSONA"))
    OldToken.objects.create(
        token_map=old_map,
        category="PERSONA",
        number=1,
        token="<<PERSONA_1>>",
        lookup_key=lookup_key,
        encrypted_surface=ring.encrypt(lookup_key, "María López"),
    )
    OldMap.objects.create(code="conv-2", sequence=0)

    migrate(AFTER)

    assert "code" not in _columns()
    stored = dict(TokenMap.objects.values_list("pk", "code_hash"))
    assert stored[old_map.pk] == code_hash(CODE)
    assert sorted(stored.values()) == sorted([code_hash(CODE), code_hash("conv-2")])
    # The map is found from its code, and the same value keeps its token.
    assert decode(CODE, "Hola <<PERSONA_1>>") == "Hola María López"
    assert encode(CODE, "maria lopez", "PERSONA") == "<<PERSONA_1>>"
    assert encode(CODE, "Otra Persona", "PERSONA") == "<<PERSONA_2>>"


def test_going_back_is_refused_while_maps_exist(at_0002: MigrationExecutor) -> None:
    migrate(AFTER)
    encode(CODE, "María López", "PERSONA")
    with pytest.raises(
        IrreversibleError, match="cannot unapply nexus_workflows 0006_minimum_necessary while PHI token maps"
    ):
        migrate(BEFORE)
    assert TokenMap.objects.for_code(CODE).exists()
