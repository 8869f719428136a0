"""Refuse to serve with DEBUG on at an address other machines can reach: Django's debug pages show settings,
SQL and source code to whoever triggers an error. Every server entry point calls `debug_bind_refuse`."""
import ipaddress

from django.core.exceptions import ImproperlyConfigured

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def host_is_public(host: str) -> bool:
    """True unless `host` (as given to a server's bind option) is a loopback address or a Unix socket."""
    host = host.strip()
    if host.startswith("unix:") or host.startswith("/"):
        return False
    host = host.removeprefix("[").removesuffix("]")
    if host.lower() in LOOPBACK_NAMES:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name other than localhost may resolve to any interface


def bind_host(bind: str) -> str:
    """The host of a `host:port`, `[v6]:port`, `unix:/path` or bare `host` bind string."""
    if bind.startswith("unix:") or bind.startswith("/"):
        return bind
    if bind.startswith("["):
        return bind[1:bind.index("]")]
    return bind.rsplit(":", 1)[0] if bind.count(":") == 1 else bind


def debug_bind_refuse(*, debug: bool, binds: list[str], process: str) -> None:
    """Raise ImproperlyConfigured when DEBUG is on and any of `binds` is reachable from other machines."""
    public = [b for b in binds if host_is_public(bind_host(b))]
    if debug and public:
        raise ImproperlyConfigured(
            f"Refusing to start {process} with DEBUG on at {', '.join(public)}, an address other machines can "
            "reach: Django's debug pages would show them settings and source code. Turn DEBUG off (unset "
            "DJANGO_DEBUG), or bind to 127.0.0.1 for local work.")


def debug_bind_exit(*, binds: list[str], process: str) -> None:
    """For a server's entry point, once settings are loaded: exit with the message instead of serving."""
    from django.conf import settings

    try:
        debug_bind_refuse(debug=settings.DEBUG, binds=binds, process=process)
    except ImproperlyConfigured as e:
        raise SystemExit(str(e)) from None
