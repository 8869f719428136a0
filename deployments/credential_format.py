"""What Tandem's secrets look like, in one pure module: the services mint and check them with it, the gateway
authenticates with it, and nothing else re-declares a prefix, a length, the check, the digest or the revocation
channel.

A secret is `<prefix>_<key_id>_<random>_<check>`: `tdm_` for a team's gateway API key, `tdp_` for a personal
access token. `<random>` is 43 base62 characters (256 bits); `<check>` is 6 base62 characters holding the first
32 bits of HMAC-SHA256(check key, everything before the last `_`), the check key being derived from the server's
secret. Like the CRC32 at the end of GitHub's tokens it catches typos and junk without a database lookup, and,
being keyed, a key made up by someone without the server's secret too: only about one guess in 4 billion passes.
Only HMAC-SHA256(server secret, whole string) is stored, with the key id and the last four characters.

Secrets minted before the check was added have three segments, `<prefix>_<key_id>_<random>` (their random part
never contains `_`), and keep working: the segment count alone tells the two kinds apart.
"""
import hashlib
import hmac
import secrets
from collections.abc import Callable

API_KEY_PREFIX = "tdm"
ACCESS_TOKEN_PREFIX = "tdp"
SECRET_MIN_LENGTH = 32
RANDOM_LENGTH = 43  # base62 characters: 256 bits
CHECK_LENGTH = 6  # base62 characters: holds 32 bits (62**6 > 2**32)
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BASE62_BYTES = BASE62.encode()
# Redis pub/sub channel on which a revoked (or otherwise changed) API key's id is announced to every gateway.
KEY_EVENTS_CHANNEL = "tandem:keys:changed"


def credential_check_key(hmac_secret: str | bytes) -> bytes:
    """The key of the check segment, derived from the server's secret (compute it once and keep it)."""
    hmac_secret = hmac_secret.encode() if isinstance(hmac_secret, str) else hmac_secret
    return hmac.digest(hmac_secret, b"tandem credential check v1", "sha256")


def _check(body: bytes, check_key: bytes) -> bytes:
    n = int.from_bytes(hmac.digest(check_key, body, "sha256")[:4], "big")
    out = bytearray(CHECK_LENGTH)
    for i in range(CHECK_LENGTH - 1, -1, -1):
        n, digit = divmod(n, 62)
        out[i] = BASE62_BYTES[digit]
    return bytes(out)


def credential_new(prefix: str, *, hmac_secret: str | bytes) -> tuple[str, str]:
    """A fresh (key_id, plaintext) pair, with its check segment."""
    key_id = secrets.token_hex(6)
    body = f"{prefix}_{key_id}_{''.join(secrets.choice(BASE62) for _ in range(RANDOM_LENGTH))}"
    return key_id, f"{body}_{_check(body.encode(), credential_check_key(hmac_secret)).decode()}"


def credential_split(raw: str | bytes, prefix: str) -> tuple[str, bool] | None:
    """(key_id, checked) of a secret with this prefix that has the right shape, else None. `checked` is False for
    a secret minted before check segments: those can only be told from a made-up one by a lookup. Only the shape
    is looked at here; `credential_check_ok` verifies the check segment."""
    if isinstance(raw, str):
        try:
            raw = raw.encode("ascii")
        except UnicodeEncodeError:
            return None
    if not isinstance(raw, bytes):
        return None
    parts = raw.split(b"_")
    if parts[0] != prefix.encode() or len(parts) not in (3, 4) or not parts[1] or len(parts[2]) < SECRET_MIN_LENGTH:
        return None
    if len(parts) == 4 and len(parts[3]) != CHECK_LENGTH:
        return None
    try:
        return parts[1].decode("ascii"), len(parts) == 4
    except UnicodeDecodeError:
        return None


def credential_check_ok(raw: str | bytes, *, check_key: bytes) -> bool:
    """Whether a checked secret's last segment is the check of the rest (constant time)."""
    raw = raw.encode("ascii", "replace") if isinstance(raw, str) else raw
    body, _, given = raw.rpartition(b"_")
    return hmac.compare_digest(given, _check(body, check_key))


def credential_digester(hmac_secret: str | bytes) -> Callable[[str | bytes], str]:
    """The stored form of a secret (hex HMAC-SHA256 under the server's key) as a function, the key set up once:
    copying a keyed HMAC takes half the time of `hmac.digest`, which looks the hash up by name on every call
    (0.85 against 1.4 us here). The gateway digests a presented key per request."""
    keyed = hmac.new(hmac_secret.encode() if isinstance(hmac_secret, str) else hmac_secret, digestmod=hashlib.sha256)

    def digest(raw: str | bytes) -> str:
        h = keyed.copy()
        h.update(raw.encode() if isinstance(raw, str) else raw)
        return h.hexdigest()

    return digest


def credential_digest(raw: str | bytes, *, hmac_secret: str | bytes) -> str:
    """The stored form of a secret: hex HMAC-SHA256 under the server's key."""
    return credential_digester(hmac_secret)(raw)


def credential_matches(raw: str | bytes, digest: str, *, hmac_secret: str | bytes | None = None,
                       digester: Callable[[str | bytes], str] | None = None) -> bool:
    """Constant-time check of a presented secret against a stored digest, under `hmac_secret` or with a
    `credential_digester` of it."""
    computed = digester(raw) if digester is not None else credential_digest(raw, hmac_secret=hmac_secret)
    return hmac.compare_digest(digest, computed)


def credential_display(prefix: str, key_id: str, last4: str) -> str:
    """How a credential is named to people once its secret is gone: `tdm_<id>_…abcd`."""
    return f"{prefix}_{key_id}_…{last4}"
