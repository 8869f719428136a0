"""Who the client is behind a load balancer: X-Forwarded-For is believed only from the trusted proxies
(`TANDEM_GATEWAY_FORWARDED_ALLOW_IPS`), and its right-most address outside them is the client (uvicorn's
ProxyHeadersMiddleware), so a client cannot pick the address its failed authentications are counted against.

A balancer's header arriving from any other peer means a proxy the gateway does not trust is in front of it (every
client behind it would share that proxy's address and its failure limit): it is counted in
`tandem_gateway_untrusted_forwarded_total` and logged once per process."""
import logging

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from controlplane.forwarded import forwarded_allow_ips_problem
from gateway import metrics

log = logging.getLogger(__name__)

# Headers a load balancer adds (AWS's ALB both; most proxies the first).
BALANCER_HEADERS = frozenset({b"x-forwarded-for", b"x-amzn-trace-id"})


def forwarded_settings_problem(forwarded_allow_ips: str, *, behind_load_balancer: bool) -> str | None:
    """Why the gateway must not start with these settings, or None: an entry that is not an address or network
    (controlplane/forwarded.py), or none at all behind a balancer, which would give every client its address."""
    problem = forwarded_allow_ips_problem("TANDEM_GATEWAY_FORWARDED_ALLOW_IPS", forwarded_allow_ips)
    if problem is None and behind_load_balancer and not forwarded_allow_ips.strip(" ,"):
        return ("TANDEM_GATEWAY_BEHIND_LOAD_BALANCER is on but TANDEM_GATEWAY_FORWARDED_ALLOW_IPS is empty: every "
                "client would have the balancer's address and share one limit on failed authentications. Set it "
                "to the balancer's addresses (on EKS, the CIDRs of the ALB's public subnets).")
    return problem


class TrustedProxyHeaders(ProxyHeadersMiddleware):
    """uvicorn's ProxyHeadersMiddleware (the client from a trusted proxy's X-Forwarded-For), also counting the
    requests that carry a balancer's header from a peer it does not trust; those are served as that peer."""

    def __init__(self, app, trusted_hosts: str):
        super().__init__(app, trusted_hosts)
        self.warned = False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            client = scope.get("client")
            peer = client[0] if client else None
            if peer in self.trusted_hosts:
                return await super().__call__(scope, receive, send)
            for name, _ in scope["headers"]:
                if name in BALANCER_HEADERS:
                    self._untrusted(peer, name)
                    break
        return await self.app(scope, receive, send)

    def _untrusted(self, peer: str | None, header: bytes) -> None:
        metrics.UNTRUSTED_FORWARDED.inc()
        if not self.warned:
            self.warned = True
            log.warning("a request from %s carries %s, but that address is not in TANDEM_GATEWAY_FORWARDED_ALLOW_IPS, "
                        "so the request is taken to come from it. Behind a load balancer, set "
                        "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS to its addresses (logged once; "
                        "tandem_gateway_untrusted_forwarded_total counts such requests)", peer, header.decode())
