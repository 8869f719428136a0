"""Clusters now declare the model sources each team may use (deployments.model_sources), and one that declares
none allows none. So that nothing running breaks, each cluster's config gets, per team, exactly the sources its
live deployments already use (a local path, an S3 URI or a Hugging Face org): nothing more, and only for that team.
"""
from django.db import migrations

# Not running and not gone: what deployments.lifecycle calls LIVE, spelled out (a migration keeps its own copy).
LIVE = ["pending_approval", "approved", "provisioning", "running", "updating", "failed", "deleting"]


def _kind(source: str) -> tuple[str, str]:
    if source.startswith("s3://"):
        return "s3", source
    if source.startswith("/"):
        return "paths", source
    return "huggingface", source.partition("/")[0]


def grandfather(apps, schema_editor):
    Cluster, Deployment = apps.get_model("deployments", "Cluster"), apps.get_model("deployments", "Deployment")
    for cluster in Cluster.objects.all():
        config = dict(cluster.config or {})
        if "model_sources" in config:
            continue
        teams: dict[str, dict[str, list[str]]] = {}
        for d in Deployment.objects.filter(cluster=cluster, status__in=LIVE).select_related("team"):
            for spec in (d.spec, d.proposed_spec):
                source = (spec or {}).get("model_source")
                if isinstance(source, str) and source:
                    kind, root = _kind(source)
                    roots = teams.setdefault(d.team.slug, {}).setdefault(kind, [])
                    if root not in roots:
                        roots.append(root)
        config["model_sources"] = {"teams": teams} if teams else {}
        cluster.config = config
        cluster.save(update_fields=["config"])


class Migration(migrations.Migration):
    dependencies = [("deployments", "0003_approval_authors_and_credential_lifetimes")]
    operations = [migrations.RunPython(grandfather, migrations.RunPython.noop)]
