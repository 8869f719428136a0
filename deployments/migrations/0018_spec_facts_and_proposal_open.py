"""The facts other layers read from a deployment's spec become columns (deployments.spec.spec_facts), and
`proposal_open` says whether a proposed update waits for an approver.

The backfill derives each row's facts through the one writer (deployments.services.spec_store), and drops the
proposed updates left behind by a deletion or a pause before the status writer cleared them: nobody could decide
them, and they stayed in the approvals queue for ever. Each dropped one gets the event a drop gets now.
"""
from django.db import migrations, models

FACTS_NOT_NULL = {
    "model_id": models.CharField(max_length=128),
    "model_source": models.TextField(),
    "max_model_len": models.PositiveIntegerField(),
    "wake_on_request": models.BooleanField(),
    "prefill_instance_type": models.CharField(max_length=64),
    "prefill_nodes": models.PositiveIntegerField(),
    "prefill_gpus_per_node": models.PositiveIntegerField(),
    "decode_instance_type": models.CharField(max_length=64),
    "decode_nodes": models.PositiveIntegerField(),
    "decode_gpus_per_node": models.PositiveIntegerField(),
}


def _nullable(field):
    name, path, args, kwargs = field.deconstruct()
    return type(field)(*args, **{**kwargs, "null": True})


def backfill(apps, schema_editor):
    from deployments.cluster_config import cluster_config_of
    from deployments.lifecycle import proposal_waits
    from deployments.services.spec_store import deployment_proposal_set, deployment_spec_set
    from deployments.spec import spec_load

    Deployment = apps.get_model("deployments", "Deployment")
    Event = apps.get_model("deployments", "Event")
    for d in Deployment.objects.select_related("cluster").iterator(chunk_size=500):
        # What the Cluster model's `config_typed` answers (a historical model has none of its properties).
        d.cluster.config_typed = cluster_config_of(d.cluster.kind, d.cluster.config)
        fields = deployment_spec_set(deployment=d, spec=spec_load(d.spec))
        dropped = d.proposed_spec
        if dropped is not None and not proposal_waits(status=d.status, proposed=True):
            Event.objects.create(
                kind="update_withdrawn", team_id=d.team_id, deployment=d, before={"proposed_spec": dropped},
                message=f"Dropped: the deployment is {d.status} now, where an update cannot be decided; ask for it "
                        "again once it runs.")
            fields += deployment_proposal_set(deployment=d, spec=None, by=None)
        else:
            fields += deployment_proposal_set(deployment=d, spec=dropped, by=d.proposed_by)
        d.save(update_fields=fields)


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0017_perms_proposal_authors"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="deployment", name="deployment_awaiting"),
        migrations.AddField(model_name="deployment", name="proposal_open", field=models.BooleanField(default=False)),
        migrations.AddField(model_name="deployment", name="idle_minutes",
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name="deployment", name="hourly_usd", field=models.FloatField(blank=True, null=True)),
        *[migrations.AddField(model_name="deployment", name=name, field=_nullable(field))
          for name, field in FACTS_NOT_NULL.items()],
        migrations.RunPython(backfill, migrations.RunPython.noop),
        *[migrations.AlterField(model_name="deployment", name=name, field=field)
          for name, field in FACTS_NOT_NULL.items()],
        migrations.AddIndex(
            model_name="deployment",
            index=models.Index(condition=models.Q(("status", "pending_approval"), ("proposal_open", True),
                                                  _connector="OR"),
                               fields=["created_at", "id"], name="deployment_awaiting"),
        ),
    ]
