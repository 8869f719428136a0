"""URL routes of the observability app (included under /api/v1/)."""
from django.urls import path

from observability import views

urlpatterns = [
    path("deployments/<int:pk>/latency/", views.DeploymentLatencyView.as_view(), name="deployment-latency"),
    path("deployments/<int:pk>/conformance/", views.DeploymentConformanceView.as_view(),
         name="deployment-conformance"),
    path("deployments/<int:pk>/attainment/", views.DeploymentAttainmentView.as_view(),
         name="deployment-attainment"),
    path("deployments/<int:pk>/recommendations/<str:rec_id>/apply/", views.RecommendationApplyView.as_view(),
         name="deployment-recommendation-apply"),
    path("plans/", views.PlanView.as_view(), name="plan"),
]
