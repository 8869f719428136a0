from django.db import models


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
