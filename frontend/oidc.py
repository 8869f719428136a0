"""Company sign-in over OpenID Connect: mozilla-django-oidc does the protocol (authorization code + PKCE, token
signature, nonce, userinfo); this backend only says which user the claims name and hands them to the sign-in
service, which makes the user's team memberships follow the groups claim."""
from django.conf import settings
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from deployments.services.sign_in import sign_in_user_from_claims


class TandemOIDCBackend(OIDCAuthenticationBackend):
    """Users are matched by the configured username claim (the e-mail by default), never by a guess."""

    def verify_claims(self, claims) -> bool:
        return bool(claims.get(settings.TANDEM_OIDC_USERNAME_CLAIM))

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(username=claims[settings.TANDEM_OIDC_USERNAME_CLAIM])

    def create_user(self, claims):
        return sign_in_user_from_claims(claims=claims)

    def update_user(self, user, claims):
        return sign_in_user_from_claims(claims=claims, user=user)


def sign_in_options(request) -> dict:
    """Template context for the sign-in page: which ways to sign in this installation offers."""
    return {"oidc_enabled": settings.TANDEM_OIDC_ENABLED, "oidc_provider_name": settings.TANDEM_OIDC_PROVIDER_NAME,
            "password_sign_in": settings.TANDEM_PASSWORD_SIGN_IN}
