from __future__ import annotations

from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from nexus_workflows.phi import SurfaceDecryptionError, decode, encode
from nexus_workflows.phi.models import PhiToken

# Committed rows, so every decode below has to decrypt what the database holds.
pytestmark = pytest.mark.django_db(transaction=True)

OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()


def keys(*fernet_keys: str) -> override_settings:
    return override_settings(
        NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": list(fernet_keys)}
    )


def rotate() -> str:
    out = StringIO()
    call_command("rotate_phi_keys", stdout=out)
    return out.getvalue()


def test_after_adding_a_key_and_rotating_the_old_key_can_go(code: str) -> None:
    values = [("María López", "PERSONA"), ("55 1234 5678", "TELEFONO"), ("maria@example.com", "EMAIL")]
    with keys(OLD_KEY):
        tokens = [encode(code, value, category) for value, category in values]
        text = " / ".join(tokens)
        assert decode(code, text) == "María López / 55 1234 5678 / maria@example.com"
    before = dict(PhiToken.objects.values_list("pk", "encrypted_surface"))

    # The new key alone cannot read the old surfaces yet.
    with keys(NEW_KEY), pytest.raises(SurfaceDecryptionError):
        decode(code, text)

    with keys(NEW_KEY, OLD_KEY):  # newest first
        assert decode(code, text) == "María López / 55 1234 5678 / maria@example.com"
        assert "Rotated 3 surface(s); 0 already" in rotate()
        assert "Rotated 0 surface(s); 3 already" in rotate()  # idempotent
    after = dict(PhiToken.objects.values_list("pk", "encrypted_surface"))
    assert after.keys() == before.keys()
    assert all(after[pk] != before[pk] for pk in before)

    with keys(NEW_KEY):  # the old key removed
        assert decode(code, text) == "María López / 55 1234 5678 / maria@example.com"
        assert encode(code, "maria lopez", "PERSONA") == tokens[0]
        encode(code, "Nuevo Valor", "PERSONA")
    with keys(OLD_KEY), pytest.raises(SurfaceDecryptionError):
        decode(code, text)


def test_a_new_key_added_in_the_wrong_place_is_pointed_out(code: str) -> None:
    """Keys are told apart only by position: with the new key last, every surface is
    already under the first (the old) key, and the operator must be told before removing it."""
    with keys(OLD_KEY):
        encode(code, "María López", "PERSONA")
    with keys(OLD_KEY, NEW_KEY):  # wrong: the new key must come first
        output = rotate()
    assert "Rotated 0 surface(s); 1 already under the newest key." in output
    assert "Nothing was under the other key. If one of them is a key you have just added" in output
    assert "it must be FIRST in PHI_ENCRYPTION_KEYS" in output
    assert "Removing the first key now would make every surface unreadable." in output
    with keys(NEW_KEY, OLD_KEY):  # put right
        output = rotate()
    assert "Rotated 1 surface(s)" in output
    assert "No surface is under the other key now: remove it once every fire-and-forget job" in output
    with keys(NEW_KEY):
        assert "Rotated 0 surface(s); 1 already" in rotate()
        assert "Nothing was under" not in rotate()  # one key: nothing to tell apart


def test_rotation_reports_surfaces_no_key_can_decrypt(code: str) -> None:
    with keys(OLD_KEY):
        token = encode(code, "María López", "PERSONA")
    pk = PhiToken.objects.get(token=token).pk
    with keys(NEW_KEY), pytest.raises(CommandError) as raised:
        rotate()
    assert f"#{pk}" in str(raised.value)
    assert "Keep the old keys" in str(raised.value)
    with keys(OLD_KEY):
        assert decode(code, token) == "María López"  # left untouched


def test_rotation_pads_surfaces_encrypted_before_padding(code: str) -> None:
    with keys(NEW_KEY):
        short, longer = encode(code, "Ana", "PERSONA"), encode(code, "Maximiliano Gutiérrez", "PERSONA")
        padded_length = len(PhiToken.objects.get(token=short).encrypted_surface)
        # Stored the way surfaces were before padding (2026-12): "<lookup key>:<surface>".
        for token, value in ((short, "Ana"), (longer, "Maximiliano Gutiérrez")):
            row = PhiToken.objects.get(token=token)
            legacy = Fernet(NEW_KEY).encrypt(f"{row.lookup_key}:{value}".encode()).decode()
            PhiToken.objects.filter(pk=row.pk).update(encrypted_surface=legacy)
        assert (
            len({len(surface) for surface in PhiToken.objects.values_list("encrypted_surface", flat=True)})
            == 2
        )
        assert "Rotated 0 surface(s); 2 already under the newest key (2 of them padded now" in rotate()
        assert "Rotated 0 surface(s); 2 already under the newest key." in rotate()
        assert {len(surface) for surface in PhiToken.objects.values_list("encrypted_surface", flat=True)} == {
            padded_length
        }
        assert decode(code, f"{short} {longer}") == "Ana Maximiliano Gutiérrez"


def test_a_new_key_in_the_wrong_place_is_pointed_out_while_older_surfaces_are_padded(code: str) -> None:
    """Padding surfaces stored before padding is not a rotation: the key-order warning
    must still be given."""
    with keys(OLD_KEY):
        token = encode(code, "María López", "PERSONA")
    row = PhiToken.objects.get(token=token)
    legacy = Fernet(OLD_KEY).encrypt(f"{row.lookup_key}:María López".encode()).decode()
    PhiToken.objects.filter(pk=row.pk).update(encrypted_surface=legacy)
    with keys(OLD_KEY, NEW_KEY):  # wrong: the new key must come first
        output = rotate()
    assert "Rotated 0 surface(s); 1 already under the newest key (1 of them padded now" in output
    assert "Nothing was under the other key. If one of them is a key you have just added" in output
    with keys(NEW_KEY, OLD_KEY):
        assert "Rotated 1 surface(s); 0 already" in rotate()
    with keys(NEW_KEY):
        assert decode(code, token) == "María López"


def test_with_padding_off_new_surfaces_are_in_the_old_format_and_rotation_unpads(code: str) -> None:
    """PHI_PADDING off, for a rolling deploy from (or back to) code before padding: what is
    written is the old format, which that code reads, and rotation brings padded rows to it."""
    with keys(NEW_KEY):
        padded_token = encode(code, "Ana", "PERSONA")

    unpadded = {**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [NEW_KEY], "PHI_PADDING": False}
    with override_settings(NEXUS_WORKFLOWS=unpadded):
        token = encode(code, "Maximiliano Gutiérrez", "PERSONA")
        row = PhiToken.objects.get(token=token)
        assert Fernet(NEW_KEY).decrypt(row.encrypted_surface.encode()).decode() == (
            f"{row.lookup_key}:Maximiliano Gutiérrez"  # what code before padding reads
        )
        assert decode(code, f"{padded_token} {token}") == "Ana Maximiliano Gutiérrez"  # both formats read
        assert "Rotated 0 surface(s); 2 already under the newest key (1 of them unpadded now" in rotate()
        assert "Rotated 0 surface(s); 2 already under the newest key." in rotate()
        for row in PhiToken.objects.all():
            plain = Fernet(NEW_KEY).decrypt(row.encrypted_surface.encode()).decode()
            assert plain.startswith(f"{row.lookup_key}:")
        assert decode(code, f"{padded_token} {token}") == "Ana Maximiliano Gutiérrez"
    with keys(NEW_KEY):  # padding back on: rotation pads both again
        assert "Rotated 0 surface(s); 2 already under the newest key (2 of them padded now" in rotate()
        assert decode(code, f"{padded_token} {token}") == "Ana Maximiliano Gutiérrez"


def test_a_row_in_no_format_this_app_writes_is_left_as_it_is(code: str) -> None:
    with keys(NEW_KEY):
        token = encode(code, "Ana", "PERSONA")
        forged = Fernet(NEW_KEY).encrypt(b"not a surface").decode()
        PhiToken.objects.filter(token=token).update(encrypted_surface=forged)
        assert "Rotated 0 surface(s); 1 already under the newest key." in rotate()
        assert PhiToken.objects.get(token=token).encrypted_surface == forged
