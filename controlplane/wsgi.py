"""WSGI entry point."""
import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

from controlplane.forwarded import TrustedProxyHeaders

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
# Behind a load balancer, its X-Forwarded-Proto and X-Forwarded-For name the scheme and the client, from it alone.
application = TrustedProxyHeaders(get_wsgi_application(), settings.TANDEM_WEB_FORWARDED_ALLOW_IPS)
