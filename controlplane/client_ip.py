"""The client's address, one rule for the sign-in limiter (django-axes) and the API's throttles (DRF)."""
from rest_framework.throttling import BaseThrottle


def client_ip(request) -> str:
    """The socket's peer (behind a proxy in TANDEM_WEB_FORWARDED_ALLOW_IPS, the client it names: controlplane/
    forwarded.py); with TANDEM_ONLY_BEHIND_PROXY, the address the proxy appended to X-Forwarded-For (DRF's
    NUM_PROXIES rule), never one a client wrote into the header itself."""
    return BaseThrottle().get_ident(request)
