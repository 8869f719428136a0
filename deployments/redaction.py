"""What members and key holders may read about a cluster: its name and kind, never its internal addresses,
role ARNs, subnets or where its secret lives.

Drivers and upstreams write messages for operators ("http://10.0.3.7:8000/v1/models answered 502"); those
messages end up in events, status reasons and conditions that every member of the team reads, and in gateway
errors that key holders read. `internal_redact` is applied where they are stored (services.events,
services.actions.deployment_transition, services.status) and where the gateway answers, so a driver that adds a
new message cannot leak by forgetting. Platform admins see the cluster's config through the API instead.
"""
import re
from urllib.parse import urlsplit

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()]+", re.IGNORECASE)
IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?![\w.])")
ARN = re.compile(r"\barn:aws[a-z-]*:[^\s'\"<>()]+")
SUBNET = re.compile(r"\b(?:subnet|sg|vpc)-[0-9a-f]{8,17}\b")
# URLs that are the user's own (their model source) or public: kept.
KEPT_SCHEMES = ("s3://", "hf://")


def _literals(cluster) -> list[str]:
    """Strings of this cluster's config and secret reference that name something internal."""
    found = []
    for value in vars(cluster.config_typed).values():
        for item in value if isinstance(value, tuple) else [value]:
            if not isinstance(item, str):
                continue
            if "://" in item:  # its host too: messages name it without the scheme (ARNs, subnets: patterns)
                found.append(urlsplit(item).netloc)
                found.append(urlsplit(item).hostname or "")
    ref = cluster.secret_ref or ""
    if ":" in ref:
        found.append(ref.partition(":")[2])
    return sorted({f for f in found if len(f) >= 4}, key=len, reverse=True)


def internal_redact(text: str, *, cluster=None) -> str:
    """`text` with internal addresses, ARNs, subnets and secret locations replaced by the cluster's name."""
    if not text:
        return text
    where = f"cluster {cluster.name}" if cluster is not None else "the cluster"

    def url(m: re.Match) -> str:
        return m[0] if m[0].lower().startswith(KEPT_SCHEMES) else f"[an address on {where}]"

    text = URL.sub(url, text)
    if cluster is not None:
        for literal in _literals(cluster):  # whole words only: a host called "prod" leaves "production" alone
            text = re.sub(rf"(?<![\w.-]){re.escape(literal)}(?![\w-])", f"[{where}]", text)
    text = ARN.sub(f"[a role on {where}]", text)
    text = SUBNET.sub(f"[a network of {where}]", text)
    return IPV4.sub(f"[an address on {where}]", text)
