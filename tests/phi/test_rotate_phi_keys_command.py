"""``manage.py rotate_phi_keys``: its arguments are checked before any row is read."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def rotate(*args: str) -> str:
    out = StringIO()
    call_command("rotate_phi_keys", *args, stdout=out)
    return out.getvalue()


ALLOWED_SIZES = "--batch-size: must be a whole number of at least 1 and at most 10,000"


@pytest.mark.parametrize(
    "size",
    [
        "100000000000000000000",  # IntegrityError (SQLite) or DataError (PostgreSQL) from its LIMIT
        "10001",
        "0",
        "-5",
        "many",
    ],
)
def test_the_batch_size_is_a_whole_number_up_to_10000(size: str) -> None:
    with pytest.raises(CommandError, match=ALLOWED_SIZES) as raised:
        rotate("--batch-size", size)
    assert repr(size) not in str(raised.value)


def test_the_largest_batch_size_is_taken() -> None:
    assert "Rotated 0 surface(s); 0 already under the newest key." in rotate("--batch-size", "10000")


def test_an_unknown_database_names_the_aliases_of_databases() -> None:
    """Not a ConnectionDoesNotExist traceback; the alias given is not echoed."""
    from django.db import connections

    with pytest.raises(CommandError, match="--database must be an alias of DATABASES: default") as raised:
        rotate("--database", "nope-s3cr3t")
    assert "s3cr3t" not in str(raised.value)
    assert str(raised.value).endswith(", ".join(connections.settings))


def test_a_known_database_is_used() -> None:
    assert "Rotated 0 surface(s)" in rotate("--database", "default")
