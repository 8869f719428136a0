"""Settings for a developer's machine and the embedded default of `./tandem up`."""
import os

os.environ.setdefault("DJANGO_SECRET_KEY", "local-only-not-secret")
os.environ.setdefault("DJANGO_DEBUG", "1")

from controlplane.settings.base import *  # noqa: E402,F403
