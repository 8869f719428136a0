from django.conf import settings
from django.db import models

from deployments.event_kinds import EventKind


class Event(models.Model):
    """One immutable line of the audit trail: who did what, when, and what changed."""

    # PROTECT: deleting a team or a deployment never deletes its history (Tandem never deletes either row; a
    # deleted deployment keeps its row with status `deleted`).
    team = models.ForeignKey("deployments.Team", on_delete=models.PROTECT, related_name="events", null=True)
    deployment = models.ForeignKey(
        "deployments.Deployment", on_delete=models.PROTECT, related_name="events", null=True, blank=True
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=40, choices=EventKind.choices)
    message = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        # The audit trail is read newest first, for a deployment (its page and API) and for a team (the API).
        indexes = [models.Index(fields=["deployment", "-created_at", "-id"], name="event_deployment_newest"),
                   models.Index(fields=["team", "-created_at", "-id"], name="event_team_newest")]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Audit events are immutable.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("Audit events are immutable.")

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.kind}"
