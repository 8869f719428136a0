"""Production settings, the default of every entry point (manage.py, wsgi, asgi, Celery, the gateway) outside
`./tandem up` and the tests: every secret from the environment with no default, HTTPS only, and never DEBUG at
an address other machines can reach."""
from controlplane.bind_check import debug_bind_refuse
from controlplane.settings.env import env, env_bool, env_int

from controlplane.settings.base import *  # noqa: F403

# --- Secrets --------------------------------------------------------------------------------------------
TANDEM_KEY_HMAC_SECRET = env("TANDEM_KEY_HMAC_SECRET", required=True)

# --- DEBUG: off, and refused where other machines could see its pages -----------------------------------
DEBUG = env_bool("DJANGO_DEBUG", False)
# Where the web server listens (gunicorn.conf.py binds here) and the gateway (settings.TANDEM_GATEWAY_HOST).
TANDEM_WEB_BIND = env("TANDEM_WEB_BIND", "127.0.0.1:8800")
debug_bind_refuse(debug=DEBUG, binds=[TANDEM_WEB_BIND, TANDEM_GATEWAY_HOST],  # noqa: F405
                  process="Tandem (production settings)")

# --- HTTPS only -------------------------------------------------------------------------------------------
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# Probes and the scraper call these over plain HTTP inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# The proxy's word that a request came over HTTPS is believed only when nothing but the proxy can reach the
# app; otherwise any client could send the header and be taken for HTTPS.
if TANDEM_ONLY_BEHIND_PROXY:  # noqa: F405
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
