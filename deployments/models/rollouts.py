"""A rollout: how one update of a running deployment reaches its users (deployments.services.rollouts)."""
from django.db import models


class Rollout(models.Model):
    """One update of a running deployment, from the generation that served to the next.

    `in_place`: the two generations can share KV (deployments.generations.kv_verdict), so Serve rolls the
    replicas. `side_by_side`: they cannot, so the new generation runs as an application of its own beside the
    old, and the gateway moves traffic to it in the spec's steps (`weight`, percent) while the old one gives its
    replicas back; at most `max_surge` extra replicas per pool at any time (`peak_surge` records the most seen).
    """

    class Mode(models.TextChoices):
        IN_PLACE = "in_place"
        SIDE_BY_SIDE = "side_by_side"

    class State(models.TextChoices):
        STARTING = "starting"  # the new generation is coming up beside the old
        CHECKING = "checking"  # it serves; its conformance run decides whether users get it
        SHIFTING = "shifting"  # traffic moves step by step, each step judged
        ROLLING_BACK = "rolling_back"  # all traffic back on the old; the new goes
        DONE = "done"  # every request goes to the new generation and the old one is gone
        ROLLED_BACK = "rolled_back"  # the old generation serves alone again
        ABORTED = "aborted"  # an admin stopped it: rolled back as a regression is

    ACTIVE = (State.STARTING, State.CHECKING, State.SHIFTING, State.ROLLING_BACK)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="rollouts")
    from_generation = models.PositiveIntegerField()
    to_generation = models.PositiveIntegerField()
    from_spec = models.JSONField()  # the spec the old generation runs (rolled back to it)
    # The application names' generation: the old one's (0: the deployment's first application) and the new one's.
    from_app = models.PositiveIntegerField(default=0)
    to_app = models.PositiveIntegerField(default=0)
    mode = models.CharField(max_length=20, choices=Mode.choices)
    verdict = models.JSONField(default=dict)  # {"compatible": bool, "reasons": [...]}
    state = models.CharField(max_length=20, choices=State.choices, default=State.STARTING)
    paused = models.BooleanField(default=False)  # an admin holds it at its current step
    step_weights = models.JSONField(default=list)  # the new spec's rollout.steps, as the rollout began
    step = models.PositiveSmallIntegerField(default=0)  # index into step_weights (its length once all are judged)
    weight = models.PositiveSmallIntegerField(default=0)  # percent of requests the new generation takes now
    replicas = models.JSONField(default=dict)  # {"old": {"prefill": n, "decode": n}, "new": {...}} as applied
    peak_surge = models.JSONField(default=dict)  # {"prefill": n, "decode": n}: the most extra replicas seen
    steps_log = models.JSONField(default=list)  # each step: weight, when, the judgement and its evidence
    reason = models.TextField(blank=True)  # why it ended as it did
    created_at = models.DateTimeField(auto_now_add=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["deployment"], condition=models.Q(state__in=[
            "starting", "checking", "shifting", "rolling_back"]), name="one_active_rollout_per_deployment")]

    def __str__(self):
        return f"{self.deployment} {self.from_generation}→{self.to_generation} ({self.state})"

    @property
    def active(self) -> bool:
        return self.state in self.ACTIVE
