"""Personal access tokens for automation: `Authorization: Bearer tdp_<id>_<secret>`."""
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from deployments.models import AccessToken
from deployments.services.credentials import credential_check


class AccessTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword:
            return None
        token = credential_check(model=AccessToken, raw=raw.strip(), related=("user",))  # one query
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked access token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            AccessToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword


class AccessTokenScheme(OpenApiAuthenticationExtension):
    """The token as an HTTP bearer scheme in the OpenAPI schema, so /api/docs/ can send it ("Authorize")."""

    target_class = AccessTokenAuthentication
    name = "accessToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A personal access token, `tdp_...`."}
