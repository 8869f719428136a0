"""Secrets as `deployments.credential_format` shapes them: a keyed check segment that refuses made-up or mistyped
secrets without a query, and secrets minted before the check (three parts) still accepted."""
import hashlib
import hmac
import secrets

import pytest
from django.conf import settings

from deployments.credential_format import (
    CHECK_LENGTH,
    CredentialDigester,
    credential_check_key,
    credential_check_ok,
    credential_digest,
    credential_matches,
    credential_new,
    credential_split,
)
from deployments.models import AccessToken
from deployments.services.access_tokens import access_token_create
from deployments.services.credentials import credential_check
from tests.factories import UserFactory


def legacy_secret(prefix: str, key_id: str) -> str:
    """A secret as Tandem minted them before check segments: `<prefix>_<key_id>_<43 url-safe characters>`."""
    return f"{prefix}_{key_id}_{secrets.token_urlsafe(32).replace('_', 'x')}"


def make_legacy(row, prefix: str) -> str:
    """Turn a freshly minted row into one minted before check segments (as rows from before the upgrade are)."""
    raw = legacy_secret(prefix, row.key_id)
    type(row).objects.filter(pk=row.pk).update(
        digest=credential_digest(raw, hmac_secret=settings.TANDEM_KEY_HMAC_SECRET), last4=raw[-4:])
    return raw


def test_a_new_secret_has_four_parts_and_a_check_only_the_server_can_make():
    key_id, raw = credential_new("tdm", hmac_secret="server-secret")
    check_key = credential_check_key("server-secret")
    assert credential_split(raw, "tdm") == (key_id, True)
    assert raw.count("_") == 3 and len(raw.rpartition("_")[2]) == CHECK_LENGTH
    assert credential_check_ok(raw, check_key=check_key)
    assert not credential_check_ok(raw, check_key=credential_check_key("another-server"))
    body, _, check = raw.rpartition("_")
    typo = body[:-1] + ("a" if body[-1] != "a" else "b")
    assert not credential_check_ok(f"{typo}_{check}", check_key=check_key)
    assert credential_split(legacy_secret("tdm", key_id), "tdm") == (key_id, False)
    for junk in ("tdm_x", f"tdm_{key_id}_short_abcdef", f"tdp_{key_id}_{'a' * 43}_abcdef", f"{raw}x",
                 "tdm_é_" + "a" * 40):
        assert credential_split(junk, "tdm") is None or not credential_check_ok(junk, check_key=check_key)


def test_the_stored_digest_is_hmac_sha256_under_the_server_secret_however_it_is_computed():
    """Rows minted by the control plane are checked by the gateway's digester: both must give the same hex
    HMAC-SHA256, for str and bytes, for every secret."""
    digester = CredentialDigester(b"server-secret")
    for raw in (credential_new("tdm", hmac_secret="server-secret")[1], legacy_secret("tdp", "abc123"), "x"):
        expected = hmac.new(b"server-secret", raw.encode(), hashlib.sha256).hexdigest()
        assert credential_digest(raw, hmac_secret="server-secret") == expected
        assert digester.digest(raw) == digester.digest(raw.encode()) == expected
        assert digester.matches(raw, expected)
        assert credential_matches(raw.encode(), expected, hmac_secret="server-secret")
        assert not digester.matches(raw + "x", expected)
        assert CredentialDigester(b"another-secret").digest(raw) != expected


@pytest.mark.django_db
def test_a_secret_with_a_wrong_check_is_refused_without_a_query(django_assert_num_queries):
    user = UserFactory()
    token, raw = access_token_create(user=user, name="ci")
    assert credential_check(model=AccessToken, raw=raw) == token
    body, _, check = raw.rpartition("_")
    forged = f"{body}_{'0' * CHECK_LENGTH if check != '0' * CHECK_LENGTH else '1' * CHECK_LENGTH}"
    with django_assert_num_queries(0):
        assert credential_check(model=AccessToken, raw=forged) is None


@pytest.mark.django_db
def test_a_secret_minted_before_check_segments_still_works():
    token, _ = access_token_create(user=UserFactory(), name="old")
    raw = make_legacy(token, "tdp")
    assert credential_check(model=AccessToken, raw=raw) == token
    assert credential_check(model=AccessToken, raw=legacy_secret("tdp", token.key_id)) is None
