from django.conf import settings
from django.db import models

from deployments.credential_format import ACCESS_TOKEN_PREFIX, API_KEY_PREFIX, credential_display


class _Credential(models.Model):
    """A secret shown once: only its HMAC-SHA256 digest, public id and last four characters are kept."""

    key_id = models.CharField(max_length=24, unique=True)
    digest = models.CharField(max_length=64)
    last4 = models.CharField(max_length=4)
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    @property
    def display(self) -> str:
        return credential_display(self.PREFIX, self.key_id, self.last4)


class AccessToken(_Credential):
    """A personal access token for the REST API (`Authorization: Bearer tdp_<id>_<secret>`)."""

    PREFIX = ACCESS_TOKEN_PREFIX
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")


class ApiKey(_Credential):
    """A team's key for the OpenAI-compatible gateway (`tdm_<id>_<secret>`), scoped to deployments. Its owner is a
    person, whose keys go when they leave the team, or nobody: a team key, the team's service account, which only
    the team's admins create and manage."""

    PREFIX = API_KEY_PREFIX
    team = models.ForeignKey("deployments.Team", on_delete=models.CASCADE, related_name="api_keys")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    # CASCADE, not SET_NULL: a deleted person's key must not turn into a live team key.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                              related_name="api_keys")
    all_deployments = models.BooleanField(default=True)
    deployments = models.ManyToManyField("deployments.Deployment", blank=True, related_name="api_keys")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    # Tandem's own key (a conformance run's): set only by Tandem, never from a name or a form. It may reach a
    # deployment that users cannot reach yet.
    is_service = models.BooleanField(default=False, editable=False)
