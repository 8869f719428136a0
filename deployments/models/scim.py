import uuid

from django.conf import settings
from django.db import models

from deployments.credential_format import SCIM_TOKEN_PREFIX
from deployments.models.credentials import _Credential


class ScimToken(_Credential):
    """The bearer token an identity provider presents to /scim/v2/ (`tds_<id>_<secret>`), minted by a platform
    admin."""

    PREFIX = SCIM_TOKEN_PREFIX
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")


class ScimUser(models.Model):
    """A user the directory provisions: the directory's own id for them (SCIM `externalId`). The user's SCIM `id` is
    their Tandem id; `userName` is their username, the OIDC username claim, which links the two ways in."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scim")
    external_id = models.CharField(max_length=255, blank=True)


class ScimGroup(models.Model):
    """A group the directory pushes, with its members. Its display name is what `TANDEM_OIDC_GROUP_MAP` maps to a
    team and role, as the groups claim's names are at sign-in."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    display_name = models.CharField(max_length=255, unique=True)
    external_id = models.CharField(max_length=255, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="scim_groups")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["display_name"]

    def __str__(self):
        return self.display_name
