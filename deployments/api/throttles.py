"""The API's request rates: DRF's own throttles, counted in the shared Redis cache (settings.CACHES)."""
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class _RateFromSettings:
    """DRF reads THROTTLE_RATES once, at import; read it per request so a changed setting takes effect."""

    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES[self.scope]


class UserThrottle(_RateFromSettings, UserRateThrottle):
    """Requests per signed-in user (access token or session)."""


class AnonThrottle(_RateFromSettings, AnonRateThrottle):
    """Requests per client address for everyone not signed in."""
