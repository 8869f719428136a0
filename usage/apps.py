from django.apps import AppConfig


class UsageConfig(AppConfig):
    """What the gateway served, kept in PostgreSQL: request records, the drain that writes them, and the usage and
    cost reads over them. The gateway itself (the request path) is not a Django app and never imports this one."""

    name = "usage"
