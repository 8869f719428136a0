"""What Tandem's secrets look like, in one pure module: the services mint and check them with it, the gateway
authenticates with it, and nothing else re-declares a prefix, a length, the digest or the revocation channel.

A secret is `<prefix>_<key_id>_<random>`: `tdm_` for a team's gateway API key, `tdp_` for a personal access
token. Only HMAC-SHA256(server secret, whole string) is stored, with the key id and the last four characters.
"""
import hmac
import secrets

API_KEY_PREFIX = "tdm"
ACCESS_TOKEN_PREFIX = "tdp"
SECRET_MIN_LENGTH = 32
# Redis pub/sub channel on which a revoked (or otherwise changed) API key's id is announced to every gateway.
KEY_EVENTS_CHANNEL = "tandem:keys:changed"


def credential_new(prefix: str) -> tuple[str, str]:
    """A fresh (key_id, plaintext) pair. The random part has no '_', so the secret always splits in three."""
    key_id = secrets.token_hex(6)
    return key_id, f"{prefix}_{key_id}_{secrets.token_urlsafe(32).replace('_', 'x')}"


def credential_split(raw: str | bytes, prefix: str) -> str | None:
    """The key id of a well-formed secret with this prefix (str or bytes), else None."""
    if isinstance(raw, str):
        try:
            raw = raw.encode("ascii")
        except UnicodeEncodeError:
            return None
    if not isinstance(raw, bytes):
        return None
    parts = raw.split(b"_")
    if len(parts) != 3 or parts[0] != prefix.encode() or not parts[1] or len(parts[2]) < SECRET_MIN_LENGTH:
        return None
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None


def credential_digest(raw: str | bytes, *, hmac_secret: str | bytes) -> str:
    """The stored form of a secret: hex HMAC-SHA256 under the server's key."""
    raw = raw.encode() if isinstance(raw, str) else raw
    hmac_secret = hmac_secret.encode() if isinstance(hmac_secret, str) else hmac_secret
    return hmac.digest(hmac_secret, raw, "sha256").hex()  # the one-shot C path: the gateway calls it per request


def credential_matches(raw: str | bytes, digest: str, *, hmac_secret: str | bytes) -> bool:
    """Constant-time check of a presented secret against a stored digest."""
    return hmac.compare_digest(digest, credential_digest(raw, hmac_secret=hmac_secret))


def credential_display(prefix: str, key_id: str, last4: str) -> str:
    """How a credential is named to people once its secret is gone: `tdm_<id>_…abcd`."""
    return f"{prefix}_{key_id}_…{last4}"
