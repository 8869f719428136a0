"""URL routes of the observability app (included under /api/v1/)."""
from django.urls import path

from observability import views

urlpatterns = [
    path("deployments/<int:pk>/latency/", views.DeploymentLatencyView.as_view(), name="deployment-latency"),
    path("deployments/<int:pk>/conformance/", views.DeploymentConformanceView.as_view(),
         name="deployment-conformance"),
    path("plans/", views.PlanView.as_view(), name="plan"),
]
