"""Company sign-in over OpenID Connect: mozilla-django-oidc does the protocol (authorization code + PKCE, token
signature, nonce, userinfo); this module says which identity the verified ID token names and hands it to the
sign-in service (the one place that decides which account that is), ends a session whose sign-in or re-check
fails, and re-checks a session with the provider every `TANDEM_OIDC_RECHECK_S`."""
import logging
import time

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.core.exceptions import SuspiciousOperation
from django.http import JsonResponse
from django_htmx.http import HttpResponseClientRefresh
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView

from deployments.services.identities import SignInRefused
from deployments.services.sign_in import sign_in_user_from_claims

# Where mozilla-django-oidc's callback writes when the provider last vouched for the session (it adds
# OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS, which Tandem keeps at 0 so that the interval is read at each request).
VOUCHED_AT = "oidc_id_token_expiration"
log = logging.getLogger(__name__)


def id_token_issuer(payload: dict) -> str:
    """The issuer of a verified ID token: its `iss` (or TANDEM_OIDC_ISSUER if it has none), which must be the
    configured issuer when one is set; an `aud` must name this client."""
    expected = settings.TANDEM_OIDC_ISSUER
    issuer = payload.get("iss") or expected
    if not issuer or (expected and issuer != expected):
        raise SuspiciousOperation(f"ID token from issuer {issuer!r}, not {expected!r}.")
    audience = payload.get("aud")
    if audience is not None and settings.OIDC_RP_CLIENT_ID not in ([audience] if isinstance(audience, str)
                                                                   else audience):
        raise SuspiciousOperation("ID token for another client.")
    return issuer


class TandemOIDCBackend(OIDCAuthenticationBackend):
    """The identity is the ID token's issuer and subject; the sign-in service decides which account it is."""

    def authenticate(self, request, **kwargs):
        # The provider unreachable, or refusing the code at its token endpoint: a failed sign-in (the person is told
        # on the sign-in page), not a server error.
        try:
            return super().authenticate(request, **kwargs)
        except requests.RequestException as e:
            log.warning("Company sign-in failed at the identity provider: %s",
                        type(e).__name__ if e.response is None else f"HTTP {e.response.status_code}")
            return None

    def get_user(self, user_id):
        # A deactivated account's session ends at its next request, as with passwords (Django's ModelBackend);
        # mozilla-django-oidc's get_user does not check.
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def get_or_create_user(self, access_token, id_token, payload):
        issuer = id_token_issuer(payload)
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not payload.get("sub") or userinfo.get("sub", payload["sub"]) != payload["sub"]:
            raise SuspiciousOperation("The userinfo names another subject than the ID token.")
        # Providers put claims in either (Entra ID's groups only in the ID token); userinfo's are the newer.
        claims = {**payload, **userinfo}
        try:
            return sign_in_user_from_claims(claims=claims, issuer=issuer)
        except SignInRefused as refused:
            messages.error(self.request, refused.message)
            return None


class TandemOIDCCallbackView(OIDCAuthenticationCallbackView):
    """A sign-in or re-check that does not succeed leaves nobody signed in (mozilla-django-oidc would keep the
    earlier session when the provider answers with a code whose identity Tandem then refuses)."""

    def login_failure(self):
        auth.logout(self.request)
        return super().login_failure()


class OIDCSessionRecheck:
    """Once `TANDEM_OIDC_RECHECK_S` has passed since the provider last vouched for a company sign-in, the next
    page asks it again without a prompt (mozilla-django-oidc's SessionRefresh: `prompt=none`). A person the
    provider no longer signs in comes back refused and is signed out; anyone else is back on the page, their groups
    synced again. An htmx request reloads the page for that; the REST API is never redirected: a session overdue
    for its re-check gets a 401 there (tokens are not sessions, and are not affected)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.recheck(request) or self.get_response(request)

    def recheck(self, request):
        vouched_at = request.session.get(VOUCHED_AT)
        if vouched_at is None or time.time() < vouched_at + settings.TANDEM_OIDC_RECHECK_S:
            return None
        if request.path.startswith("/api/") and request.user.is_authenticated:
            return JsonResponse({"detail": "Your portal session is due for a sign-in check: reload the portal."},
                                status=401)
        refresh = SessionRefresh(self.get_response)  # built per request: it reads the provider's settings
        if not refresh.is_refreshable_url(request):
            return None
        if request.htmx:
            return HttpResponseClientRefresh()
        return refresh.process_request(request)


def sign_in_options(request) -> dict:
    """Template context for the sign-in page: which ways to sign in this installation offers."""
    return {"oidc_enabled": settings.TANDEM_OIDC_ENABLED, "oidc_provider_name": settings.TANDEM_OIDC_PROVIDER_NAME,
            "password_sign_in": settings.TANDEM_PASSWORD_SIGN_IN}
