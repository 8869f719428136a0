from django.conf import settings
from django.db import models

from deployments.conditions import CHECKING, CLOSED, OPEN
from deployments.hashing import content_hash
from deployments.lifecycle import TERMINAL, Status
from deployments.quota_rules import quota_gpus
from deployments.spec import DeploymentSpec, spec_load

# Waits for an approver: a request, or a proposed update that can be decided (the queue and its index).
AWAITING_APPROVAL = models.Q(status=Status.PENDING_APPROVAL) | models.Q(proposal_open=True)


class Deployment(models.Model):
    """A team's PD deployment: the approved spec, a proposed change awaiting approval, and observed status.

    `spec` is what workers drive towards; `generation` counts its changes and `observed_generation` the
    last one a worker fully applied. `conditions` is a list of Kubernetes-style condition dicts.
    """

    team = models.ForeignKey("deployments.Team", on_delete=models.PROTECT, related_name="deployments")
    name = models.CharField(max_length=40)
    cluster = models.ForeignKey("deployments.Cluster", on_delete=models.PROTECT, related_name="deployments")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    purpose = models.TextField(blank=True, max_length=2000)
    spec = models.JSONField()
    proposed_spec = models.JSONField(null=True, blank=True)
    # Who wrote the spec now waiting for approval (the request, an edit of it, or a proposed update): four-eyes
    # is checked against this person at approval time. Null when nothing waits.
    proposed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="+")
    # A proposed update waits for an approver (deployments.lifecycle.proposal_waits): written with `proposed_spec`,
    # and cleared with it by the status writer when the deployment leaves the statuses where it can be decided.
    proposal_open = models.BooleanField(default=False)
    # Facts of the approved spec that other layers filter and join on (the gateway's SQL, quota, idle pause,
    # search, cost), so that only deployments.spec reads the spec's JSON: written with `spec`, in the same
    # transaction, by deployments.services.spec_store (deployments.spec.spec_facts derives them). No defaults: a
    # row written any other way fails rather than serving under an empty model id.
    model_id = models.CharField(max_length=128)
    model_source = models.TextField()
    max_model_len = models.PositiveIntegerField()
    wake_on_request = models.BooleanField()
    idle_minutes = models.PositiveIntegerField(null=True, blank=True)
    prefill_instance_type = models.CharField(max_length=64)
    prefill_nodes = models.PositiveIntegerField()
    prefill_gpus_per_node = models.PositiveIntegerField()
    decode_instance_type = models.CharField(max_length=64)
    decode_nodes = models.PositiveIntegerField()
    decode_gpus_per_node = models.PositiveIntegerField()
    # USD per hour of the approved spec's nodes at the cluster's own prices, while they are provisioned (null: an
    # instance type nobody prices).
    hourly_usd = models.FloatField(null=True, blank=True)
    generation = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING_APPROVAL)
    status_reason = models.TextField(blank=True)
    observed_generation = models.PositiveIntegerField(default=0)
    conditions = models.JSONField(default=list, blank=True)
    # Whether users' keys may reach it (deployments.conditions.endpoint_access), written with the conditions it
    # follows from (services.status.deployment_observe) and read by the gateway; the message says why it is closed.
    endpoint_access = models.CharField(max_length=10, default=OPEN, choices=[(a, a) for a in (OPEN, CHECKING, CLOSED)])
    endpoint_access_message = models.TextField(blank=True)
    endpoint_url = models.URLField(blank=True, help_text="Where the gateway sends this deployment's traffic.")
    applied_hash = models.CharField(max_length=64, blank=True)
    # Which generation answers at endpoint_url, and (during a side-by-side rollout, deployments.models.Rollout) the
    # next generation's endpoint and the percent of requests the gateway sends it. Written by the reconciler only.
    endpoint_generation = models.PositiveIntegerField(default=0)
    next_endpoint_url = models.URLField(blank=True)
    next_generation = models.PositiveIntegerField(null=True, blank=True)
    next_weight = models.PositiveSmallIntegerField(default=0)
    # The generation in the name of the application that serves (0: its first application's name, no suffix).
    app_generation = models.PositiveIntegerField(default=0)
    # Which half of its NIXL port block the serving application binds on a shared `ray` cluster (0 or 1): a
    # side-by-side rollout's new generation takes the other half (deployments.serve_config.ray_nixl_ports).
    app_port_half = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    # Kept for the reconciler on the row, not read back from the event log: transient errors in a row (drives
    # the backoff) and when the conformance run the endpoint waits for was last started.
    transient_errors = models.PositiveIntegerField(default=0)
    conformance_requested_at = models.DateTimeField(null=True, blank=True)
    # What each step of the reconcile pipeline last said ({event kind: message as its event stored it}): a pass
    # records a step's event only when its outcome differs, and passes repeat.
    step_messages = models.JSONField(default=dict, blank=True)
    # Seconds a resume is expected to take to serving, from this deployment's own history (deployments.cost),
    # written when it pauses: the gateway's Retry-After for a request that wakes it.
    ready_estimate_seconds = models.PositiveIntegerField(null=True, blank=True)
    # When a reconcile pass last saw the target serve it (Serve's application RUNNING and the endpoint answering).
    # An observation, unlike `status`: after a Ray cluster restarts empty, the row says `running` until a pass
    # looks, and whoever waits for "running on this cluster" waits for a sighting after the cluster started.
    serving_seen_at = models.DateTimeField(null=True, blank=True)
    # When its deletion was first asked for (written by the status writer as it moves to deleting): from then on
    # it only goes on out (deployments.lifecycle.DELETION), and a retry of a failed deletion deletes again.
    delete_requested_at = models.DateTimeField(null=True, blank=True)
    # When a pass that found its nodes ready and its application applied expects it to serve by, at the latest
    # (workers.pipeline): past it, a deployment still not serving fails with what the cluster reports. Reset by
    # every status change (deployment_transition), so each start has a deadline of its own.
    serve_deadline_at = models.DateTimeField(null=True, blank=True)
    # When the target confirmed that nothing of a failed deployment runs any more (deployments.lifecycle.RELEASES):
    # null while something may still run and bill. Reset by every status change: a retry runs again.
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]  # newest first; the id breaks ties, so pages never overlap
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name"],
                condition=~models.Q(status__in=[s.value for s in Status if s in TERMINAL]),
                name="unique_live_deployment_name_per_team",
            )
        ]
        indexes = [
            models.Index(fields=["status"]),
            # Every list is newest first, a page at a time: all deployments (platform admins), a team's (portal, API).
            models.Index(fields=["-created_at", "-id"], name="deployment_newest"),
            models.Index(fields=["team", "-created_at", "-id"], name="deployment_team_newest"),
            # The approvals queue, oldest first: only what waits is indexed (the same condition as the queue's).
            models.Index(fields=["created_at", "id"], name="deployment_awaiting",
                         condition=AWAITING_APPROVAL),
        ]

    def __str__(self):
        return f"{self.team}/{self.name}"

    @property
    def spec_typed(self) -> DeploymentSpec:
        """The approved spec as frozen data; the JSON column is only its storage form (read on each access, so
        a changed `spec` is never shadowed by a stale copy)."""
        return spec_load(self.spec)

    @property
    def awaits_approval(self) -> bool:
        """Something of it waits for an approver: the request itself, or a proposed update where it can be
        decided (`proposal_open`); the approvals queue's own condition (AWAITING_APPROVAL), for one row."""
        return self.status == Status.PENDING_APPROVAL or self.proposal_open

    @property
    def proposed_spec_hash(self) -> str | None:
        """Names the proposed update an approver reviewed: approve and reject must echo it back."""
        return None if self.proposed_spec is None else content_hash(self.proposed_spec)

    @property
    def quota_gpus(self) -> int:
        """GPUs the approved spec holds against the team's quota on this deployment's cluster."""
        return quota_gpus(self.spec_typed, target_kind=self.cluster.kind)
