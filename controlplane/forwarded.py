"""Who the client is behind a load balancer, one rule for the portal and the gateway: a proxy's X-Forwarded-Proto
and X-Forwarded-For are believed only from the trusted proxies' addresses (a comma-separated list of addresses and
CIDRs, on EKS the ALB's public subnets), and the client is the right-most X-Forwarded-For address outside them. The rule is
uvicorn's (its ProxyHeadersMiddleware, which the gateway runs); `TrustedProxyHeaders` applies it to the portal's
WSGI requests. A client or pod that connects directly is taken for its own address whatever it writes."""
import ipaddress

from uvicorn.middleware.proxy_headers import _TrustedHosts


def forwarded_allow_ips_problem(setting: str, forwarded_allow_ips: str) -> str | None:
    """Why `setting`'s value cannot be used, or None. An entry that is not an address or network would trust
    nothing without a word from uvicorn, and every client would have the balancer's address."""
    for entry in (e.strip() for e in forwarded_allow_ips.split(",")):
        if not entry:
            continue
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            return (f"{setting} has {entry!r}, which is not an IP address or network (CIDR, host bits zero): "
                    "list the load balancer's addresses, e.g. its subnets' CIDRs 10.0.0.0/20,10.0.16.0/20.")
    return None


class TrustedProxyHeaders:
    """WSGI middleware: from a trusted proxy, X-Forwarded-Proto sets the scheme (so HTTPS is seen as HTTPS and not
    redirected again) and X-Forwarded-For the client's address (REMOTE_ADDR, which the sign-in limit and the API's
    throttles count by); from any other peer both are ignored."""

    def __init__(self, app, trusted_hosts: str):
        self.app = app
        self.trusted_hosts = _TrustedHosts(trusted_hosts)

    def __call__(self, environ, start_response):
        if environ.get("REMOTE_ADDR") in self.trusted_hosts:
            proto = environ.get("HTTP_X_FORWARDED_PROTO", "").strip()
            if proto in ("http", "https"):
                environ["wsgi.url_scheme"] = proto
            forwarded_for = environ.get("HTTP_X_FORWARDED_FOR")
            if forwarded_for:
                host, _ = self.trusted_hosts.get_trusted_client_address(forwarded_for)
                if host:
                    environ["REMOTE_ADDR"] = host
        return self.app(environ, start_response)
