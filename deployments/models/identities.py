from django.conf import settings
from django.db import models


class ExternalIdentity(models.Model):
    """A person at an identity provider (OpenID Connect issuer and subject), and the Tandem account they sign in as.

    The pair is what names a person across sign-ins: an e-mail can be unverified, changed or given to someone else.
    Written only by `deployments.services.identities`.
    """

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities")
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_identity")]
        ordering = ["issuer", "subject"]
        verbose_name_plural = "external identities"

    def __str__(self):
        return f"{self.subject} at {self.issuer}"
