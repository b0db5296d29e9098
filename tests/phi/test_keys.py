from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.test import override_settings

from nexus_workflows.phi import PhiConfigurationError, SurfaceDecryptionError, decode, encode
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.checks import check_phi_keys, check_phi_settings
from nexus_workflows.phi.keys import keyring
from nexus_workflows.phi.models import PhiToken, TokenMap

GOOD_HMAC = "a-dedicated-hmac-key-of-at-least-32-characters"
GOOD_FERNET = Fernet.generate_key().decode()


def check_ids(**nexus_settings: object) -> list[str]:
    with override_settings(NEXUS_WORKFLOWS=nexus_settings):
        return [message.id for message in check_phi_keys() + check_phi_settings()]  # type: ignore[misc]


def test_configured_keys_pass_the_checks() -> None:
    assert check_ids(**settings.NEXUS_WORKFLOWS) == []
    two_keys = f"{GOOD_FERNET}, {Fernet.generate_key().decode()}"  # one comma-separated string
    assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=two_keys) == []


@override_settings(DEBUG=False)
def test_missing_keys_with_debug_off_are_errors() -> None:
    assert check_ids() == ["nexus_workflows.E100", "nexus_workflows.E101"]
    assert check_ids(PHI_ENCRYPTION_KEYS=[GOOD_FERNET]) == ["nexus_workflows.E100"]
    assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=[]) == ["nexus_workflows.E101"]


@override_settings(DEBUG=True)
def test_missing_keys_with_debug_on_are_not_errors() -> None:
    assert check_ids() == []


@pytest.mark.parametrize("debug", [False, True])
def test_a_key_equal_to_the_secret_key_is_an_error(debug: bool) -> None:
    secret_fernet = Fernet.generate_key().decode()
    secret_hmac = "the-project-secret-key-which-is-long-enough-1234"
    with override_settings(DEBUG=debug, SECRET_KEY=secret_hmac):
        assert check_ids(PHI_HMAC_KEY=secret_hmac, PHI_ENCRYPTION_KEYS=[GOOD_FERNET]) == [
            "nexus_workflows.E102"
        ]
    with override_settings(DEBUG=debug, SECRET_KEY=secret_fernet):
        assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=[GOOD_FERNET, secret_fernet]) == [
            "nexus_workflows.E102"
        ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("secret", "hmac_key"),
    [("ñ" * 50, GOOD_HMAC), ("a-secret-key-" * 4, "contraseña-" * 4), ("clave-\udce9" * 6, GOOD_HMAC)],
)
def test_keys_and_a_secret_key_with_letters_beyond_ascii_work(secret: str, hmac_key: str) -> None:
    # compare_digest refuses str with any non-ASCII letter: the checks and every encode
    # raised TypeError. The last SECRET_KEY holds a lone surrogate (a Latin-1 byte read
    # from os.environ): compared as it is, never refused.
    keys = {"PHI_HMAC_KEY": hmac_key, "PHI_ENCRYPTION_KEYS": [GOOD_FERNET]}
    with override_settings(DEBUG=False, SECRET_KEY=secret, NEXUS_WORKFLOWS=keys):
        assert check_ids(**keys) == []
        token = encode("conv-1", "María López", "PERSONA")
        assert decode("conv-1", token) == "María López"


def test_a_key_beyond_ascii_equal_to_the_secret_key_is_an_error() -> None:
    secret = "contraseña-del-proyecto-" * 2
    with override_settings(SECRET_KEY=secret):
        assert check_ids(PHI_HMAC_KEY=secret, PHI_ENCRYPTION_KEYS=[GOOD_FERNET]) == ["nexus_workflows.E102"]


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_an_hmac_key_that_is_no_valid_unicode_is_an_error_and_encodes_nothing() -> None:
    keys = {"PHI_HMAC_KEY": "clave-\udce9" * 6, "PHI_ENCRYPTION_KEYS": [GOOD_FERNET]}
    assert check_ids(**keys) == ["nexus_workflows.E104"]
    with override_settings(NEXUS_WORKFLOWS=keys), pytest.raises(PhiConfigurationError, match="valid Unicode"):
        encode("conv-1", "María López", "PERSONA")
    assert not TokenMap.objects.exists()


@override_settings(DEBUG=False)
def test_bad_keys_and_settings_are_errors() -> None:
    assert check_ids(PHI_HMAC_KEY="short", PHI_ENCRYPTION_KEYS=[GOOD_FERNET]) == ["nexus_workflows.E104"]
    assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=["not-a-fernet-key"]) == [
        "nexus_workflows.E103"
    ]
    assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=42) == [
        "nexus_workflows.E103",
        "nexus_workflows.E101",
    ]
    assert check_ids(PHI_HMAC_KEY=GOOD_FERNET, PHI_ENCRYPTION_KEYS=[GOOD_FERNET]) == ["nexus_workflows.E105"]
    assert check_ids(PHI_HMAC_KEY=GOOD_HMAC, PHI_ENCRYPTION_KEYS=[GOOD_FERNET, GOOD_FERNET]) == [
        "nexus_workflows.W100"
    ]
    base = {"PHI_HMAC_KEY": GOOD_HMAC, "PHI_ENCRYPTION_KEYS": [GOOD_FERNET]}
    assert check_ids(**base, PHI_DEFAULT_REGION="XX") == ["nexus_workflows.E106"]
    assert check_ids(**base, PHI_DEFAULT_REGION="mx") == ["nexus_workflows.E106"]
    assert check_ids(**base, PHI_CACHE_TTL=0) == ["nexus_workflows.E107"]
    assert check_ids(**base, PHI_CACHE_SIZE=0) == ["nexus_workflows.E108"]


def test_check_messages_never_contain_the_keys() -> None:
    with override_settings(
        DEBUG=False,
        SECRET_KEY=GOOD_FERNET,
        NEXUS_WORKFLOWS={"PHI_HMAC_KEY": "shortish-key", "PHI_ENCRYPTION_KEYS": [GOOD_FERNET, "bad-key-xyz"]},
    ):
        text = " ".join(f"{message.msg} {message.hint}" for message in check_phi_keys())
    for secret in (GOOD_FERNET, "shortish-key", "bad-key-xyz"):
        assert secret not in text


@pytest.mark.django_db
@override_settings(DEBUG=False, NEXUS_WORKFLOWS={})
def test_without_keys_and_debug_off_encode_raises_and_writes_nothing() -> None:
    with pytest.raises(PhiConfigurationError, match="PHI_HMAC_KEY"):
        encode("conv-1", "María López", "PERSONA")
    assert not TokenMap.objects.exists()


@pytest.mark.django_db
def test_with_debug_on_and_no_keys_dev_keys_come_from_the_secret_key(
    phi_log: pytest.LogCaptureFixture,
) -> None:
    with override_settings(
        DEBUG=True, NEXUS_WORKFLOWS={}, SECRET_KEY="first-development-secret-key-0123456789"
    ):
        token = encode("conv-1", "María López", "PERSONA")
        assert decode("conv-1", token) == "María López"
        first = keyring().lookup_key("conv-1", "PERSONA", "maria lopez")
    with override_settings(
        DEBUG=True, NEXUS_WORKFLOWS={}, SECRET_KEY="other-development-secret-key-0123456789"
    ):
        assert keyring().lookup_key("conv-1", "PERSONA", "maria lopez") != first
    assert keyring().lookup_key("conv-1", "PERSONA", "maria lopez") != first  # the test keys differ too
    warnings = [record for record in phi_log.records if record.levelname == "WARNING"]
    assert warnings
    assert "derived from SECRET_KEY" in warnings[0].getMessage()


# transaction=True: the rows are committed, so nothing but the database can answer.
@pytest.mark.django_db(transaction=True)
def test_a_surface_that_cannot_be_decrypted_raises_never_returns_ciphertext(code: str) -> None:
    token = encode(code, "María López", "PERSONA")
    ciphertext = PhiToken.objects.get(token=token).encrypted_surface
    other_keys = {**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    with override_settings(NEXUS_WORKFLOWS=other_keys):
        with pytest.raises(SurfaceDecryptionError) as raised:
            decode(code, f"Hola {token}")
        with pytest.raises(SurfaceDecryptionError):
            encode(code, "MARÍA LÓPEZ", "PERSONA")  # the upgrade check needs the stored surface
    assert ciphertext not in str(raised.value)
    assert "María" not in str(raised.value)


@pytest.mark.django_db(transaction=True)
def test_a_surface_moved_to_another_token_raises(code: str) -> None:
    first = encode(code, "María López", "PERSONA")
    second = encode(code, "José Núñez", "PERSONA")
    # Someone with write access to the table swaps the ciphertexts.
    stolen = PhiToken.objects.get(token=second).encrypted_surface
    PhiToken.objects.filter(token=first).update(encrypted_surface=stolen)
    token_cache.clear()
    with pytest.raises(SurfaceDecryptionError, match="belongs to another token"):
        decode(code, first)
    assert decode(code, second) == "José Núñez"


@override_settings(DEBUG=False, NEXUS_WORKFLOWS=["not", "a", "dict"])
def test_no_phi_messages_when_the_settings_are_not_a_dict() -> None:
    # nexus_workflows.E001 reports that; PHI messages would only repeat it.
    assert check_phi_keys() == []
    assert check_phi_settings() == []


def test_a_sealed_value_opens_only_under_its_own_context() -> None:
    ring = keyring()
    sealed = ring.seal("job|k__1", '{"phone": "+525512345678"}')
    assert "5512345678" not in sealed
    assert ring.unseal("job|k__1", sealed) == '{"phone": "+525512345678"}'
    # Neither another context, nor one that a naive "context + text" would confuse with it.
    assert ring.unseal("job|k__2", sealed) is None
    assert ring.unseal("job|k__", sealed) is None
    assert ring.unseal("job|k__1", "not a fernet token") is None


def test_a_value_sealed_under_an_older_key_opens_while_that_key_is_listed() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [old]}):
        sealed = keyring().seal("job|k__1", "Ana")
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [new, old]}):
        assert keyring().unseal("job|k__1", sealed) == "Ana"
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_ENCRYPTION_KEYS": [new]}):
        assert keyring().unseal("job|k__1", sealed) is None


def test_phi_setting_errors_name_the_type_never_the_value() -> None:
    with override_settings(
        NEXUS_WORKFLOWS={"PHI_DEFAULT_REGION": "María", "PHI_CACHE_TTL": 1e300, "PHI_CACHE_SIZE": 10**7}
    ):
        messages = check_phi_settings()
    assert [message.id for message in messages] == [
        "nexus_workflows.E106",
        "nexus_workflows.E107",
        "nexus_workflows.E108",
    ]
    text = " ".join(message.msg for message in messages)
    assert "María" not in text
    assert "got a string of 5 character(s)" in text
    assert "at most 315,619,200" in text
    assert "at most 1,000,000" in text


# transaction=True: the ciphertexts compared are the committed rows.
@pytest.mark.django_db(transaction=True)
def test_a_surfaces_ciphertext_does_not_tell_a_short_value_from_a_long_one(code: str) -> None:
    values = ["Ana", "Maximiliano Gutiérrez de la Fuente", "55 1234 5678", "maria.lopez.garcia@example.com"]
    tokens = [encode(code, value, "PERSONA") for value in values]
    lengths = {len(PhiToken.objects.get(token=token).encrypted_surface) for token in tokens}
    assert len(lengths) == 1
    token_cache.clear()
    assert [decode(code, token) for token in tokens] == values
    # A value longer than a pad block still round-trips (and is longer at rest).
    long_value = " ".join(["María"] * 40)
    long_token = encode(code, long_value, "PERSONA")
    token_cache.clear()
    assert decode(code, long_token) == long_value
    assert len(PhiToken.objects.get(token=long_token).encrypted_surface) > lengths.pop()


@pytest.mark.django_db(transaction=True)
def test_a_surface_encrypted_before_padding_still_decrypts(code: str) -> None:
    token = encode(code, "María López", "PERSONA")
    row = PhiToken.objects.get(token=token)
    newest = Fernet(settings.NEXUS_WORKFLOWS["PHI_ENCRYPTION_KEYS"][0])
    legacy = newest.encrypt(f"{row.lookup_key}:María López".encode()).decode()
    PhiToken.objects.filter(pk=row.pk).update(encrypted_surface=legacy)
    token_cache.clear()
    assert decode(code, token) == "María López"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("plain", ["{lookup}|99:Ana   ", "{lookup}|3:Ana  x", "{lookup}|x:Ana", "{lookup}|3"])
def test_a_padded_surface_that_does_not_parse_is_reported_altered(code: str, plain: str) -> None:
    token = encode(code, "Ana", "PERSONA")
    row = PhiToken.objects.get(token=token)
    newest = Fernet(settings.NEXUS_WORKFLOWS["PHI_ENCRYPTION_KEYS"][0])
    forged = newest.encrypt(plain.format(lookup=row.lookup_key).encode()).decode()
    PhiToken.objects.filter(pk=row.pk).update(encrypted_surface=forged)
    token_cache.clear()
    with pytest.raises(SurfaceDecryptionError, match="the row was altered") as raised:
        decode(code, token)
    assert "Ana" not in str(raised.value)


def test_sealed_values_of_different_lengths_look_alike_and_older_seals_still_open() -> None:
    ring = keyring()
    short = ring.seal("job|k__1", "Ana")
    longer = ring.seal("job|k__1", '{"patient": "Maximiliano Gutiérrez"}')
    assert len(short) == len(longer)
    assert ring.unseal("job|k__1", short) == "Ana"
    assert ring.unseal("job|k__1", longer) == '{"patient": "Maximiliano Gutiérrez"}'
    newest = Fernet(settings.NEXUS_WORKFLOWS["PHI_ENCRYPTION_KEYS"][0])
    before_padding = newest.encrypt(b"8:job|k__1Ana").decode()
    assert ring.unseal("job|k__1", before_padding) == "Ana"
    assert ring.unseal("job|k__", before_padding) is None


def test_with_padding_off_values_are_sealed_in_the_old_format() -> None:
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_PADDING": False}):
        ring = keyring()
        sealed = ring.seal("job|k__1", "Ana")
        assert ring.unseal("job|k__1", sealed) == "Ana"
    newest = Fernet(settings.NEXUS_WORKFLOWS["PHI_ENCRYPTION_KEYS"][0])
    assert newest.decrypt(sealed.encode()) == b"8:job|k__1Ana"  # what code before padding opens
    assert keyring().unseal("job|k__1", sealed) == "Ana"  # and padding on reads it too


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_padding_setting_that_is_not_a_bool_is_an_error(value: object) -> None:
    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "PHI_PADDING": value}):
        messages = check_phi_settings()
    assert [message.id for message in messages] == ["nexus_workflows.E109"]
    assert "True or False" in messages[0].msg
    assert "yes" not in messages[0].msg
