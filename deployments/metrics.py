"""What /metrics counts of the domain (controlplane.health serves it; this app registers it at start)."""
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from deployments.models import Deployment


class DeploymentsByStatus:
    """`tandem_deployments{status}`, counted at each scrape."""

    def collect(self):
        family = GaugeMetricFamily("tandem_deployments", "Deployments by status", labels=["status"])
        for row in Deployment.objects.values("status").order_by().annotate(n=Count("id")):
            family.add_metric([row["status"]], row["n"])
        yield family
