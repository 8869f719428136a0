"""The one reader of the process environment for settings."""
import os

from django.core.exceptions import ImproperlyConfigured


def env(name: str, default: str | None = None, *, required: bool = False) -> str:
    """Return an environment variable; refuse to start when a required one is missing."""
    value = os.environ.get(name)
    if value:
        return value
    if required:
        raise ImproperlyConfigured(f"Set the environment variable {name}: it has no default in this environment.")
    return default or ""


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def env_labels(name: str, default: str = "") -> dict[str, str]:
    """Kubernetes labels written `key=value,key2=value2` (a label selector's equality terms); {} when unset."""
    value = os.environ.get(name) or default
    terms = [t.strip() for t in value.split(",") if t.strip()]
    if any("=" not in t or not t.split("=", 1)[0] for t in terms):
        raise ImproperlyConfigured(f"{name} must be labels written key=value,key2=value2; got {value!r}.")
    return dict(t.split("=", 1) for t in terms)
