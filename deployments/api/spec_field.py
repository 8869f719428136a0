"""The `spec` of the deployment writes: read by deployments.spec (strictly), described in /api/schema/ by the
components deployments.spec_schema generates from the same dataclasses."""
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from deployments.spec_schema import spec_schema_components

SPEC_COMPONENT = "DeploymentSpec"


class SpecField(serializers.JSONField):
    """A request-shaped spec. Its shape and rules are checked where it is written (deployments.spec.spec_parse),
    so the API, the portal and Tandem's own proposals answer alike."""


class SpecFieldSchema(OpenApiSerializerFieldExtension):
    """SpecField in the schema: a reference to the spec's component, with the components of its sections."""

    target_class = SpecField

    def map_serializer_field(self, auto_schema, direction):
        components = spec_schema_components()
        for name, schema in components.items():
            auto_schema.registry.register_on_missing(ResolvedComponent(
                name=name, type=ResolvedComponent.SCHEMA, object=f"deployments.spec.{name}", schema=schema))
        return {"allOf": [{"$ref": f"#/components/schemas/{SPEC_COMPONENT}"}],
                "description": self.target.help_text or components[SPEC_COMPONENT]["description"]}
