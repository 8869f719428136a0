from django.conf import settings
from django.db import models

from deployments.cluster_config import ClusterConfig, cluster_config_of


class Cluster(models.Model):
    """A registered target: an EKS cluster, any Kubernetes with KubeRay, or an existing Ray cluster.

    `config` holds only non-secret settings; `secret_ref` names where a credential lives (an environment
    variable or a mounted file) and is never returned by the API.
    """

    class Kind(models.TextChoices):
        EKS = "eks"
        KUBERNETES = "kubernetes"
        RAY = "ray"

    name = models.SlugField(max_length=40, unique=True)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    config = models.JSONField(default=dict, blank=True)
    secret_ref = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.kind})"

    @property
    def config_typed(self) -> ClusterConfig:
        """`config` as its kind's dataclass, defaults filled in: what every reader of the config reads."""
        return cluster_config_of(self.kind, self.config)


class ClusterCheck(models.Model):
    """One preflight run against a cluster (workers.preflight): requested, then finished with one line per check."""

    class Status(models.TextChoices):
        RUNNING = "running"
        PASSED = "passed"  # no check failed (some may be unverified)
        FAILED = "failed"  # at least one check failed
        ERROR = "error"  # the run itself could not finish (its error says why)

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="checks")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["cluster", "-created_at"])]

    def __str__(self):
        return f"check {self.pk} of {self.cluster.name}: {self.status}"


class ClusterCheckLine(models.Model):
    """One check of a run: pass, fail or unverified, what was seen, and the fix."""

    class Status(models.TextChoices):
        PASS = "pass"
        FAIL = "fail"
        UNVERIFIED = "unverified"

    check_run = models.ForeignKey(ClusterCheck, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=40)
    status = models.CharField(max_length=10, choices=Status.choices)
    evidence = models.TextField()
    fix = models.TextField(blank=True)
    # What the line is about ("instance:p5.48xlarge", "family:P", "runtime:<key>": deployments.check_subjects); a
    # failing line stops the approval of a deployment that uses its subject. Blank: the cluster as a whole.
    subject = models.CharField(max_length=120, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["check_run", "position"], name="one_line_per_position")]
