"""URL routes of the gateway app (included under /api/v1/)."""
from django.urls import path

from gateway.views import UsageView

urlpatterns = [path("usage/", UsageView.as_view(), name="gateway-usage")]
