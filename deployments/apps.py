from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"

    def ready(self):
        # Here, not at the top: the models load only once the app registry is ready.
        from controlplane.health import METRICS
        from deployments.metrics import DeploymentsByStatus

        METRICS.register(DeploymentsByStatus())
