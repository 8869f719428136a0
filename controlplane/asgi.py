"""ASGI entry point for the web app (the gateway has its own: gateway.app)."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.production")
application = get_asgi_application()
