from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from controlplane import health

# A path under /api/ that matches no route answers JSON like every other API error (deployments/api/contract.py).
handler404 = "deployments.api.errors.not_found"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("deployments.api.urls")),
    path("api/v1/", include("usage.urls")),
    path("api/v1/", include("observability.urls")),
    path("scim/v2/", include("deployments.scim.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI from drf-spectacular-sidecar; its start-up script is a file of its own, as the CSP requires.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", health.metrics),
    path("accounts/", include("django.contrib.auth.urls")),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("", include("frontend.urls")),
]
