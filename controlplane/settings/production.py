"""Production settings: every secret comes from the environment, with no default."""
from controlplane.settings.env import env

from controlplane.settings.base import *  # noqa: F403

DEBUG = False
TANDEM_KEY_HMAC_SECRET = env("TANDEM_KEY_HMAC_SECRET", required=True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
