"""The typed spec: rows stored before versioning still load, a stored spec is re-checked as typed data against
today's catalog (at approval and in the reconciler), and one DNS-1123 check serves every Kubernetes-bound name."""
import json

import pytest
from django.utils import timezone

from deployments.api.serializers import ClusterSerializer, TeamSerializer
from deployments.catalog import INSTANCE_TYPES, KNOWN_BROKEN
from deployments.cost import cluster_prices, spec_hourly_usd
from deployments.cluster_config import cluster_config_errors
from deployments.lifecycle import Status
from deployments.model_sources import source_roots_of
from deployments.services import actions
from deployments.services.quota import team_gpus_held
from deployments.spec import SpecError, name_errors, spec_check, spec_load, spec_parse
from frontend import planning
from observability.selectors import fleet_reader
from tests.factories import DeploymentFactory, local_spec_input, spec_input
from workers.pipeline import reconcile_pass

# A GPU row exactly as every deployment stored so far holds it (asdict output, no "version" key), written out
# by hand so that a change to to_dict() cannot change the fixture along with it.
POOL_KEYS = ("instance_type", "nodes", "gpus_per_node", "tensor_parallel_size", "replicas_min", "replicas_max")
OLD_ROW = {
    "model_id": "llama-3-8b", "model_source": "s3://models/llama-3-8b", "runtime": "ray-2.60.0-vllm-0.29.0",
    "prefill": dict(zip(POOL_KEYS, ("g6e.12xlarge", 1, 4, 4, 1, 1))),
    "decode": dict(zip(POOL_KEYS, ("g6e.12xlarge", 2, 4, 2, 1, 4))),
    "engine": {"max_model_len": 8192, "dtype": "bfloat16", "gpu_memory_utilization": 0.9,
               "kv_connector": "NixlConnector"},
    "expected_load": {"requests_per_second": 2.0, "mean_prompt_tokens": 1024, "mean_output_tokens": 256},
}


def test_an_old_row_loads_as_typed_data_and_stores_back_unchanged():
    spec = spec_load(OLD_ROW)
    assert spec.decode.tensor_parallel_size == 2 and spec.engine.max_model_len == 8192
    assert spec.gpus == 4 + 8
    assert json.dumps(spec.to_dict(), sort_keys=True) == json.dumps(OLD_ROW, sort_keys=True)
    assert spec_load({**OLD_ROW, "version": 1}) == spec  # a row that names version 1 reads the same


def test_what_spec_parse_stores_is_what_spec_load_reads():
    parsed = spec_parse(spec_input(), target_kind="kubernetes")
    assert spec_load(json.loads(json.dumps(parsed.to_dict()))) == parsed


@pytest.mark.parametrize(("row", "says"), [
    ({**OLD_ROW, "version": 2}, "version 2"),
    ({k: v for k, v in OLD_ROW.items() if k != "decode"}, "malformed"),
    ({**OLD_ROW, "prefill": {**OLD_ROW["prefill"], "gpus": 4}}, "malformed"),
    ("not an object", "not an object"),
])
def test_a_row_this_version_cannot_read_is_a_spec_error_not_a_crash(row, says):
    with pytest.raises(SpecError) as e:
        spec_load(row)
    assert says in e.value.errors["spec"][0]


def test_the_check_on_a_typed_spec_finds_what_parsing_the_same_input_finds(monkeypatch):
    spec = spec_load(OLD_ROW)
    assert spec_check(spec, target_kind="eks") is spec
    monkeypatch.setitem(KNOWN_BROKEN, ("2.60.0", "0.29.0"), "Found broken later.")
    monkeypatch.delitem(INSTANCE_TYPES, "g6e.12xlarge")
    with pytest.raises(SpecError) as checked:
        spec_check(spec, target_kind="eks")
    with pytest.raises(SpecError) as parsed:
        spec_parse({"model": {"id": spec.model_id, "source": spec.model_source}, "runtime": spec.runtime,
                    "prefill": OLD_ROW["prefill"], "decode": OLD_ROW["decode"]}, target_kind="eks")
    assert "Found broken later." in checked.value.errors["runtime"][0]
    assert "Unknown instance type 'g6e.12xlarge'" in checked.value.errors["decode.instance_type"][0]
    assert checked.value.errors == parsed.value.errors


def test_a_spec_is_checked_against_the_cluster_kind_it_runs_on():
    local = spec_parse(local_spec_input(), target_kind="ray")
    with pytest.raises(SpecError) as e:
        spec_check(local, target_kind="kubernetes")
    assert "cannot run on a kubernetes cluster" in e.value.errors["runtime"][0]
    assert "only works on a `ray` cluster" in e.value.errors["model.source"][0]


@pytest.mark.django_db
def test_an_instance_type_dropped_since_the_request_is_refused_at_approval(member, team_admin, team, cluster,
                                                                           monkeypatch):
    d = actions.deployment_request(actor=member, team=team, cluster=cluster, name="llama", spec=spec_input())
    monkeypatch.delitem(INSTANCE_TYPES, "g6e.12xlarge")
    with pytest.raises(SpecError) as e:
        actions.deployment_approve(actor=team_admin, deployment=d, generation=d.generation)
    assert "Unknown instance type 'g6e.12xlarge'" in e.value.errors["prefill.instance_type"][0]
    d.refresh_from_db()
    assert d.status == Status.PENDING_APPROVAL


@pytest.mark.django_db
def test_the_reconciler_fails_an_approved_spec_that_is_no_longer_valid(cluster, monkeypatch):
    d = DeploymentFactory(cluster=cluster, spec=json.loads(json.dumps(OLD_ROW)), status=Status.APPROVED)
    monkeypatch.setitem(KNOWN_BROKEN, ("2.60.0", "0.29.0"), "Found broken later.")
    assert reconcile_pass(d.pk) is None  # failed before touching the cluster: nothing to come back for
    d.refresh_from_db()
    assert d.status == Status.FAILED
    assert "no longer valid" in d.status_reason and "Found broken later." in d.status_reason


@pytest.mark.django_db
def test_old_rows_count_against_quota_and_get_a_plan(cluster):
    d = DeploymentFactory(cluster=cluster, spec=json.loads(json.dumps(OLD_ROW)), status=Status.RUNNING)
    assert team_gpus_held(team=d.team) == 12
    d.refresh_from_db()
    plan, note = planning.plan_for_stored(d.spec_typed, source_roots=source_roots_of(cluster=cluster, team=d.team),
                                          fleet=fleet_reader(user=d.requested_by, now=timezone.now()),
                                          prices=cluster_prices(cluster))
    # An s3:// model cannot be read from here: no plan, and the note says why (not a crash on the old row).
    assert plan is None and "config.json facts" in note
    assert spec_hourly_usd(d.spec_typed, prices=cluster_prices(cluster)) == pytest.approx(
        3 * INSTANCE_TYPES["g6e.12xlarge"].hourly_usd)


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["Bad_Name", "-edge", "edge--", "a" * 64])
def test_every_kubernetes_bound_name_goes_through_the_one_dns_label_check(bad):
    assert name_errors(bad)
    team = TeamSerializer(data={"slug": bad, "name": "T", "gpu_quota": 1})
    assert not team.is_valid() and "slug" in team.errors
    cluster = ClusterSerializer(data={"name": bad, "kind": "ray", "config": {"dashboard_url": "http://ray:8265"}})
    assert not cluster.is_valid() and "name" in cluster.errors
    assert any("namespace_prefix" in m for m in cluster_config_errors("kubernetes", {"namespace_prefix": bad}))


@pytest.mark.parametrize("good", ["tandem-", "t", "team-a", "a" * 20 + "-"])
def test_prefixes_may_end_in_one_dash(good):
    assert cluster_config_errors("eks", {"region": "us-west-2", "cluster_name": "c", "nodegroup_prefix": good,
                                         "namespace_prefix": good, "subnet_ids": ["subnet-0123456789abcdef0"],
                                         "node_role_arn": "arn:aws:iam::123456789012:role/nodes"}) == []
