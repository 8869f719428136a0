from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"

    def ready(self):
        # Here, not at the top: the models load only once the app registry is ready.
        from controlplane.health import metrics_register
        from deployments.metrics import DeploymentsByStatus

        metrics_register(DeploymentsByStatus())
