"""/scim/v2/: the company directory's provisioning endpoints (deployments.scim.views)."""
from django.urls import path, re_path

from deployments.scim import views

urlpatterns = [
    path("Users", views.collection, {"ep": views.USERS}, name="scim-users"),
    path("Users/<str:pk>", views.item, {"ep": views.USERS}, name="scim-user"),
    path("Groups", views.collection, {"ep": views.GROUPS}, name="scim-groups"),
    path("Groups/<str:pk>", views.item, {"ep": views.GROUPS}, name="scim-group"),
    path("ServiceProviderConfig", views.service_provider_config, name="scim-service-provider-config"),
    path("ResourceTypes", views.resource_types, name="scim-resource-types"),
    path("ResourceTypes/<str:pk>", views.resource_types, name="scim-resource-type"),
    path("Schemas", views.schemas, name="scim-schemas"),
    path("Schemas/<str:pk>", views.schemas, name="scim-schema"),
    path(".search", views.search_everything),
    re_path(r"^(?P<path>.*)$", views.not_found),  # a SCIM error body, not the API's JSON 404
]
