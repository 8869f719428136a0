from django.db import migrations, models

# The reconcile pipeline's step events (deployments.event_kinds, "what a reconcile pass did").
STEP_KINDS = ("node_pools", "applied", "serve_status", "endpoint", "teardown", "pause")


def step_messages_from_events(apps, schema_editor):
    """Each deployment's last message per step, as the pipeline read it from the event log before: the first pass
    after the upgrade repeats nothing."""
    Deployment, Event = apps.get_model("deployments", "Deployment"), apps.get_model("deployments", "Event")
    last = (Event.objects.filter(kind__in=STEP_KINDS, deployment__isnull=False)
            .order_by("deployment_id", "kind", "-created_at", "-id")
            .distinct("deployment_id", "kind").values_list("deployment_id", "kind", "message"))
    messages: dict[int, dict] = {}
    for deployment_id, kind, message in last:
        messages.setdefault(deployment_id, {})[kind] = message
    for deployment_id, step_messages in messages.items():
        Deployment.objects.filter(pk=deployment_id).update(step_messages=step_messages)


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0019_endpoint_access'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='step_messages',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(step_messages_from_events, migrations.RunPython.noop),
    ]
