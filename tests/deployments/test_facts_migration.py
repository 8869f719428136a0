"""Migration 0018 on rows written before it: each deployment gets its spec's facts, and a proposed update that a
deletion or a pause left waiting where nobody could decide it leaves the approvals queue, with an event."""
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from deployments.models import Deployment
from deployments.spec import spec_parse
from tests.factories import MODEL_SOURCES, spec_input

BEFORE = [("deployments", "0017_perms_proposal_authors")]


def _migrate(targets=None):
    """To `targets` (None: every app's latest, where the rest of the suite expects the schema)."""
    executor = MigrationExecutor(connection)
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_rows_written_before_get_their_facts_and_an_undecidable_proposal_is_dropped():
    old = _migrate(BEFORE)
    team = old.get_model("deployments", "Team").objects.create(slug="ml", name="ML", gpu_quota=64)
    cluster = old.get_model("deployments", "Cluster").objects.create(
        name="gpu", kind="kubernetes", config={"model_sources": MODEL_SOURCES, "prices": {"g6e.12xlarge": 7.5}})
    user = old.get_model("auth", "User").objects.create(username="ada")
    spec = spec_parse(spec_input(model={"id": "chat-70b", "source": "s3://models/llama-3-8b"},
                                 pause={"idle_minutes": 30, "wake_on_request": True}),
                      target_kind="kubernetes").to_dict()
    bigger = spec | {"decode": spec["decode"] | {"nodes": 2}}
    rows = old.get_model("deployments", "Deployment").objects
    waits = rows.create(team=team, cluster=cluster, requested_by=user, name="waits", spec=spec, status="running",
                        proposed_spec=bigger, proposed_by=user)
    stuck = rows.create(team=team, cluster=cluster, requested_by=user, name="stuck", spec=spec, status="deleted",
                        proposed_spec=bigger, proposed_by=user)

    _migrate()
    waits, stuck = Deployment.objects.get(pk=waits.pk), Deployment.objects.get(pk=stuck.pk)
    assert (waits.model_id, waits.max_model_len, waits.idle_minutes, waits.wake_on_request) == (
        "chat-70b", 8192, 30, True)
    assert (waits.decode_instance_type, waits.decode_nodes, waits.decode_gpus_per_node, waits.hourly_usd) == (
        "g6e.12xlarge", 1, 4, 15.0)
    assert (waits.proposal_open, waits.proposed_spec, waits.proposed_by_id) == (True, bigger, user.pk)
    assert (stuck.proposal_open, stuck.proposed_spec, stuck.proposed_by) == (False, None, None)
    dropped = stuck.events.get(kind="update_withdrawn")
    assert dropped.before == {"proposed_spec": bigger} and "deleted now" in dropped.message
