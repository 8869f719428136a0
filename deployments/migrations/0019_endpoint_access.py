"""Whether users' keys reach a deployment is stored beside the conditions it follows from (the gateway read it from
the conditions' JSON in its SQL before): each existing row gets it from its conditions, by the same function the
conditions' writer uses from now on."""
from django.db import migrations, models

from deployments.conditions import endpoint_access


def endpoint_access_backfill(apps, schema_editor):
    Deployment = apps.get_model("deployments", "Deployment")
    for d in Deployment.objects.exclude(conditions=[]).only("pk", "conditions").iterator():
        access, message = endpoint_access(d.conditions)
        Deployment.objects.filter(pk=d.pk).update(endpoint_access=access, endpoint_access_message=message)


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0018_spec_facts_and_proposal_open"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="endpoint_access",
            field=models.CharField(choices=[("open", "open"), ("checking", "checking"), ("closed", "closed")],
                                   default="open", max_length=10),
        ),
        migrations.AddField(
            model_name="deployment",
            name="endpoint_access_message",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(endpoint_access_backfill, migrations.RunPython.noop),
    ]
