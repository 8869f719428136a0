"""A member may load weights only from the roots the cluster declares for everyone or for their team: not another
team's directory, bucket or organisation that the nodes happen to be able to read, nor a file through a plan."""
import json

import pytest

from deployments.lifecycle import Status
from deployments.models import Membership
from deployments.spec import spec_parse
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory, local_spec_input
from workers.pipeline import reconcile_pass
from workers.targets.base import PermanentError
from workers.targets.ray import RayTarget

pytestmark = pytest.mark.django_db
FACTS = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
         "head_dim": 64, "intermediate_size": 192, "vocab_size": 1024, "torch_dtype": "bfloat16"}


@pytest.fixture
def disk(tmp_path):
    """Team A's weights, team B's directory (with a link into A's), a shared directory and a stray config.json."""
    for d in ("shared", "team-a/weights", "team-b/mine", "elsewhere"):
        (tmp_path / d).mkdir(parents=True)
    for d in ("shared", "team-a/weights", "team-b/mine", "elsewhere"):
        (tmp_path / d / "config.json").write_text(json.dumps(FACTS))
    (tmp_path / "team-b/sneaky").symlink_to(tmp_path / "team-a/weights")
    (tmp_path / "team-b/linked-config").mkdir()
    (tmp_path / "team-b/linked-config/config.json").symlink_to(tmp_path / "elsewhere/config.json")
    return tmp_path


@pytest.fixture
def shared(disk):
    """One Ray cluster for both teams, on this machine."""
    return ClusterFactory(name="shared", kind="ray", config={
        "dashboard_url": "http://127.0.0.1:9", "model_sources": {
            "paths": [str(disk / "shared")], "s3": ["s3://acme-shared/models"], "huggingface": ["meta-llama"],
            "teams": {"team-a": {"paths": [str(disk / "team-a")], "s3": ["s3://acme-team-a"]},
                      "team-b": {"paths": [str(disk / "team-b")]}}}})


@pytest.fixture
def team_b_member(db):
    team = TeamFactory(slug="team-b", gpu_quota=8)
    TeamFactory(slug="team-a")
    return MembershipFactory(team=team, role=Membership.Role.MEMBER).user


def request_source(api, user, source: str, cluster="shared"):
    api.force_authenticate(user)
    spec = local_spec_input(model={"id": "tiny-llama", "source": source})
    return api.post("/api/v1/deployments/", {"team": "team-b", "cluster": cluster, "name": "chat", "spec": spec},
                    format="json")


@pytest.mark.parametrize("source", [
    "{disk}/team-a/weights",                # another team's weights, by path
    "{disk}/team-b/../team-a/weights",      # ... through `..`
    "{disk}/team-b/sneaky",                 # ... through a symlink inside the team's own root
    "/etc",                                 # anything the nodes can read
    "s3://acme-team-a/llama",               # another team's bucket
    "s3://acme-shared/models-private/x",    # a bucket prefix that only starts like an allowed one
    "s3://acme-shared/models/../private/x",
    "evilcorp/llama-3",                     # a Hugging Face organisation nobody allowed
])
def test_a_model_source_outside_the_roots_the_cluster_allows_the_team_is_a_400_naming_them(api, team_b_member,
                                                                                           shared, disk, source):
    r = request_source(api, team_b_member, source.format(disk=disk))
    assert r.status_code == 400, r.json()
    message = r.json()["errors"]["spec.model.source"][0]
    assert f"paths under {disk}/shared, {disk}/team-b" in message
    assert "S3 under s3://acme-shared/models" in message and "Hugging Face organisations meta-llama" in message
    assert "team-a" not in message  # another team's roots are not shown


@pytest.mark.parametrize("source", ["{disk}/team-b/mine", "{disk}/shared/tiny", "s3://acme-shared/models/llama",
                                    "meta-llama/Llama-3.1-8B"])
def test_a_source_inside_the_roots_is_accepted(api, team_b_member, shared, disk, source):
    assert request_source(api, team_b_member, source.format(disk=disk)).status_code == 201


def test_a_cluster_that_declares_no_roots_allows_none(api, team_b_member, disk):
    ClusterFactory(name="bare", kind="ray", config={"dashboard_url": "http://127.0.0.1:9"})
    r = request_source(api, team_b_member, f"{disk}/team-b/mine", cluster="bare")
    assert r.status_code == 400 and "allows no model sources" in r.json()["errors"]["spec.model.source"][0]


def test_an_update_to_another_teams_weights_is_refused(api, team_b_member, shared, disk):
    d = DeploymentFactory(team=team_b_member.memberships.get().team, cluster=shared, requested_by=team_b_member,
                          name="chat", status=Status.RUNNING,
                          spec=spec_parse(local_spec_input(model={"id": "tiny-llama", "source": f"{disk}/team-b/mine"}),
                                          target_kind="ray").to_dict())
    api.force_authenticate(team_b_member)
    spec = local_spec_input(model={"id": "tiny-llama", "source": f"{disk}/team-a/weights"})
    r = api.patch(f"/api/v1/deployments/{d.pk}/", {"spec": spec}, format="json")
    assert r.status_code == 400 and "spec.model.source" in r.json()["errors"]  # named as a create names it


def _stored(team, cluster, source, status):
    spec = spec_parse(local_spec_input(model={"id": "tiny-llama", "source": source}), target_kind="ray").to_dict()
    return DeploymentFactory(team=team, cluster=cluster, name="chat", spec=spec, status=status)


def test_the_reconciler_and_preflight_refuse_a_stored_spec_outside_the_roots(team_b_member, shared, disk):
    """A spec stored before the roots were narrowed (or written around the API) never reaches the cluster."""
    team = team_b_member.memberships.get().team
    d = _stored(team, shared, f"{disk}/team-a/weights", Status.APPROVED)
    assert reconcile_pass(d.pk) is None  # the dashboard (port 9) is never called: validation fails first
    d.refresh_from_db()
    assert d.status == Status.FAILED and "Not a model source this cluster allows your team" in d.status_reason
    with pytest.raises(PermanentError, match="Not a model source"):
        RayTarget(shared).preflight(d)  # and preflight reads no config.json outside them


def test_preflight_reads_config_json_only_through_allowed_real_paths(team_b_member, shared, disk):
    team = team_b_member.memberships.get().team
    linked = _stored(team, shared, f"{disk}/team-b/linked-config", Status.APPROVED)
    with pytest.raises(PermanentError, match="no config.json"):
        RayTarget(shared).preflight(linked)  # its config.json is a link out of the roots: not read
    mine = _stored(TeamFactory(slug="team-c"), shared, f"{disk}/shared", Status.APPROVED)
    RayTarget(shared).preflight(mine)


def plan(api, **body):
    spec = local_spec_input(model={"id": "tiny-llama", "source": body.pop("source")})
    return api.post("/api/v1/plans/", {"spec": spec, **body}, format="json")


def test_a_plan_reads_no_config_json_outside_the_roots(api, team_b_member, shared, disk):
    """Before, any signed-in user could make the web process read /any/dir/config.json through a plan."""
    api.force_authenticate(team_b_member)
    r = plan(api, source=f"{disk}/elsewhere")
    assert r.status_code == 400 and "model_facts" in r.json()["errors"]
    r = plan(api, source=f"{disk}/team-a/weights", team="team-b", cluster="shared")
    assert r.status_code == 400 and "spec.model.source" in r.json()["errors"]
    r = plan(api, source=f"{disk}/team-b/linked-config", team="team-b", cluster="shared")
    assert r.status_code == 400 and "model_facts" in r.json()["errors"]
    r = plan(api, source=f"{disk}/team-a/weights", team="team-a", cluster="shared")  # not the caller's team
    assert r.status_code == 400 and "team" in r.json()["errors"]
    r = plan(api, source=f"{disk}/team-b/mine", team="team-b", cluster="shared")
    assert r.status_code == 200 and r.json()["model"]["facts_from"] == f"{disk}/team-b/mine/config.json"


def test_a_cluster_config_with_malformed_roots_is_refused(api, platform_admin):
    api.force_authenticate(platform_admin)
    r = api.post("/api/v1/clusters/", {"name": "lab", "kind": "ray", "config": {
        "dashboard_url": "http://127.0.0.1:8265",
        "model_sources": {"paths": ["relative/dir"], "s3": ["s3://b/../x"], "teams": {"t": {"gcs": ["gs://x"]}}}}},
        format="json")
    assert r.status_code == 400
    assert {m.split(":")[0] for m in r.json()["errors"]["config"]} == {"model_sources.paths", "model_sources.s3",
                                                               "model_sources.teams.t"}


def test_the_upgrade_keeps_what_runs_and_grants_nothing_more(team_b_member, disk):
    """Clusters registered before roots existed get, per team, exactly the sources its live deployments use."""
    import importlib

    from django.apps import apps

    from deployments.model_sources import source_roots_of

    migration = importlib.import_module("deployments.migrations.0004_model_sources_of_live_deployments")
    old = ClusterFactory(name="old", kind="ray", config={"dashboard_url": "http://127.0.0.1:9"})
    team_b = team_b_member.memberships.get().team
    _stored(team_b, old, f"{disk}/team-b/mine", Status.RUNNING)
    gone = _stored(TeamFactory(slug="team-c"), old, f"{disk}/team-a/weights", Status.DELETED)
    migration.grandfather(apps, None)
    old.refresh_from_db()
    assert old.config["model_sources"] == {"teams": {"team-b": {"paths": [f"{disk}/team-b/mine"]}}}
    assert source_roots_of(cluster=old, team=team_b).allows(f"{disk}/team-b/mine")
    assert not source_roots_of(cluster=old, team=gone.team).allows(f"{disk}/team-a/weights")
