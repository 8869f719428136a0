"""URL routes of the usage app (included under /api/v1/)."""
from django.urls import path

from usage.views import DeploymentCostView, UsageView

urlpatterns = [path("usage/", UsageView.as_view(), name="gateway-usage"),
               path("deployments/<int:pk>/cost/", DeploymentCostView.as_view(), name="deployment-cost")]
