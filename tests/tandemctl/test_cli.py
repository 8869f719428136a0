"""tandemctl as a user runs it: a subprocess against the real web process (gunicorn), a real Celery worker
driving the emulated Kubernetes cluster, and the real gateway in front of the mock upstream."""
import ast
import json
import os
import subprocess
import sys

import pytest
import yaml
from openai import APIStatusError, OpenAI

from deployments.conditions import condition_true
from deployments.lifecycle import Status
from deployments.models import AccessToken, Cluster, Deployment, Membership
from deployments.services.credentials import credential_mint
from deployments.services.status import RECONCILE_TASK
from deployments.spec import spec_parse
from tandemctl import errors
from tandemctl.client import operations_missing
from tests.factories import (MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, MembershipFactory,
                             TeamFactory, spec_input)
from tests.observability.test_planner import LLAMA_8B
from tests.support.processes import (ROOT, Worker, start_gateway, start_mock_upstream, start_web, stop_at_end,
                                     wait_for, worker_environment)
from tests.support.tandemctl import tandemctl
from tests.test_layers import imported_modules


def test_every_operation_the_cli_calls_is_in_the_schema(api, db):
    """Schema drift breaks the build: the CLI's operations, checked against the schema the server serves."""
    assert operations_missing(api.get("/api/schema/?format=json").json()) == []
    assert operations_missing({"paths": {}})  # and the check itself notices a missing one


def test_a_config_file_others_can_read_is_refused(tmp_path):
    config = tmp_path / ".config" / "tandem" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("server: http://127.0.0.1:9\ntoken: tdp_x\n")
    config.chmod(0o644)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "tandemctl", "get"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == errors.AUTH and "chmod 600" in run.stderr


def test_tandem_up_leaves_tandemctl_a_working_config_and_never_replaces_one(live_server, tmp_path):
    """After `./tandem up` (its bootstrap), `.venv/bin/tandemctl get` answers with no flag or variable: the local
    server and an admin token are in tandemctl's config file, readable by its owner only; a second `up`, or a user
    who has a config of their own, keeps the file as it is."""
    from deployments.local_setup import local_bootstrap, tandemctl_config_write

    local_bootstrap(password_file=tmp_path / "admin-password")
    config = tmp_path / "xdg" / "tandem" / "config.yaml"
    assert tandemctl_config_write(path=config, server=live_server.url)
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    written = config.read_text()
    assert not tandemctl_config_write(path=config, server="http://elsewhere.example")
    assert config.read_text() == written
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "tandemctl", "get", "-o", "json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []  # the admin's view of a Tandem with no deployment yet
    assert AccessToken.objects.get().name == "tandemctl (tandem up)"


@pytest.fixture
def stack(transactional_db, redis_client, kubeconfig, tmp_path, stop_at_end):
    """The web process, a worker, the gateway and its mock upstream; a team with a member and an admin."""
    team = TeamFactory(slug="ml-research", gpu_quota=16)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    ClusterFactory(name="k8s-emu", kind=Cluster.Kind.KUBERNETES, secret_ref=kubeconfig,
                   config={"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES,
                           "runtime_images": RUNTIME_IMAGES})
    tokens = {who: credential_mint(model=AccessToken, user=user, name="ci")[1]
              for who, user in (("member", member), ("admin", admin))}
    return {"web": stop_at_end(start_web(tmp_path)), "mock": stop_at_end(start_mock_upstream(tmp_path)),
            "gateway": stop_at_end(start_gateway(tmp_path)),
            "worker": stop_at_end(Worker(worker_environment(tmp_path)).start()), "tokens": tokens}


@pytest.mark.e2e
def test_apply_approve_wait_key_and_an_openai_call_then_apply_again_changes_nothing(stack, tmp_path):
    server = stack["web"].base_url
    member = dict(token=stack["tokens"]["member"], server=server, home=tmp_path)
    admin = dict(token=stack["tokens"]["admin"], server=server, home=tmp_path)
    manifest = tmp_path / "chat.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1", "kind": "Deployment",
                                        "metadata": {"team": "ml-research", "name": "chat", "cluster": "k8s-emu"},
                                        "spec": spec_input()}))

    created = tandemctl("apply", "-f", str(manifest), **member, check_rc=errors.PENDING_APPROVAL)
    assert "deployment ml-research/chat created (pending_approval" in created.stdout
    tandemctl("approve", "ml-research/chat", "--comment", "go", **admin, check_rc=errors.OK)
    tandemctl("wait", "ml-research/chat", "--for", "running", "--timeout", "90", **member, check_rc=errors.OK)

    d = Deployment.objects.get(team__slug="ml-research", name="chat")
    last_event, generation = d.events.order_by("-pk").values_list("pk", flat=True).first(), d.generation
    again = tandemctl("apply", "-f", str(tmp_path), **member, check_rc=errors.OK)  # a directory: the same file
    assert again.stdout.strip() == f"deployment ml-research/chat unchanged (running, generation {generation})"
    d.refresh_from_db()
    assert (d.generation, d.proposed_spec) == (generation, None)
    # Nobody's action was recorded (the worker may still note its own progress, e.g. the conformance run).
    assert list(d.events.filter(pk__gt=last_event, actor__isnull=False).values_list("kind", flat=True)) == []

    described = tandemctl("describe", "chat", "--team", "ml-research", **member, check_rc=errors.OK).stdout
    assert "Status:      running" in described and "Applied" in described and "approved" in described

    key = json.loads(tandemctl("keys", "create", "--team", "ml-research", "--name", "ci", "--deployment", "chat",
                               "-o", "json", **member, check_rc=errors.OK).stdout)
    assert key["key_id"] in key["secret"] and key["deployments"] == [d.pk]
    listed = tandemctl("keys", "list", "--team", "ml-research", **member, check_rc=errors.OK).stdout
    assert key["key_id"] in listed and key["secret"] not in listed

    # The emulated cluster has no in-cluster DNS: once the endpoint has opened (its conformance run done) and the
    # worker is stopped (no reconcile rewrites it), the deployment's Service URL is pointed at the mock upstream.
    wait_for(lambda: condition_true(Deployment.objects.get(pk=d.pk).conditions, "EndpointReady"), timeout=60,
             what="EndpointReady")
    stack["worker"].stop()
    Deployment.objects.filter(pk=d.pk).update(endpoint_url=stack["mock"].base_url)
    client = OpenAI(base_url=stack["gateway"].base_url + "/v1", api_key=key["secret"], max_retries=0)
    reply = wait_for(lambda: _chat(client, d.spec["model_id"]), timeout=10, what="the gateway to route")
    assert reply.choices[0].message.content

    # A changed spec shows its diff and waits for approval; the running spec is untouched.
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["decode"]["nodes"] = 2
    manifest.write_text(yaml.safe_dump(doc))
    changed = tandemctl("apply", "-f", str(manifest), **member, check_rc=errors.PENDING_APPROVAL).stdout
    assert "update proposed" in changed and "decode.nodes: 1 → 2 (needs approval)" in changed, changed
    d.refresh_from_db()
    assert d.generation == generation and d.spec["decode"]["nodes"] == 1 and d.proposed_spec["decode"]["nodes"] == 2


@pytest.fixture
def web(transactional_db, redis_client, tmp_path):
    """The web process alone, with no worker, so that whatever is enqueued stays on the broker to be counted; a
    member of ml-research and the running deployment chat they requested."""
    team = TeamFactory(slug="ml-research", gpu_quota=16)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    d = DeploymentFactory(team=team, cluster=ClusterFactory(name="k8s-emu"), requested_by=member, name="chat",
                          status=Status.RUNNING)
    proc = start_web(tmp_path)
    try:
        yield {"server": proc.base_url, "token": credential_mint(model=AccessToken, user=member, name="ci")[1],
               "deployment": d}
    finally:
        proc.stop()


def _write_manifest(path, spec: dict) -> None:
    path.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1", "kind": "Deployment",
                                    "metadata": {"team": "ml-research", "name": "chat", "cluster": "k8s-emu"},
                                    "spec": spec}))


def _queued_tasks(redis_client) -> list[str]:
    """The names of the tasks waiting on the Celery broker (no worker takes them here)."""
    return [json.loads(raw)["headers"]["task"] for raw in redis_client.lrange("celery", 0, -1)]


@pytest.mark.e2e
def test_diff_previews_a_change_and_keeps_nothing_then_apply_makes_it(web, tmp_path, redis_client):
    cli = dict(token=web["token"], server=web["server"], home=tmp_path)
    d, manifest = web["deployment"], tmp_path / "chat.yaml"

    def stored():
        row = Deployment.objects.get(pk=d.pk)
        return row.generation, row.spec, row.proposed_spec, row.status, row.events.count()

    _write_manifest(manifest, spec_input())
    unchanged = tandemctl("diff", "-f", str(manifest), **cli, check_rc=errors.OK)
    assert unchanged.stdout.strip() == "deployment ml-research/chat unchanged (running, generation 1)"

    decode = {"instance_type": "g6e.12xlarge", "nodes": 2, "gpus_per_node": 4, "tensor_parallel_size": 4}
    _write_manifest(manifest, spec_input(decode=decode))
    before = stored()
    diff = tandemctl("diff", "-f", str(manifest), **cli, check_rc=errors.CHANGES).stdout.splitlines()
    assert diff[0] == ("deployment ml-research/chat would get a proposed update that waits for approval; the "
                       "approved spec keeps running")
    assert diff[1] == "  decode.nodes: 1 → 2 (needs approval)" and "GPUs against quota: 8 → 12" in diff[2]
    [preview] = json.loads(tandemctl("apply", "--dry-run", "-f", str(manifest), "-o", "json", **cli,
                                     check_rc=errors.OK).stdout)
    assert (preview["outcome"], preview["changes"]) == (
        "proposed", [{"field": "decode.nodes", "old": 1, "new": 2, "needs_approval": True}])
    # Nothing was kept: no generation, spec, proposed spec or event, and no reconcile task on the broker.
    assert stored() == before and _queued_tasks(redis_client) == []

    applied = tandemctl("apply", "-f", str(manifest), **cli, check_rc=errors.PENDING_APPROVAL).stdout.splitlines()
    assert applied[:len(diff)] == diff  # the same preview first, then what was done
    assert applied[len(diff)] == "deployment ml-research/chat update proposed (running, generation 1)"
    assert stored()[:3] == (before[0], before[1], spec_parse(spec_input(decode=decode), target_kind="kubernetes")
                            .to_dict()) and stored()[4] == before[4] + 1
    tandemctl("diff", "-f", str(manifest), **cli, check_rc=errors.OK)  # it waits as proposed: nothing more to do

    # A change with nothing to approve: previewed without its reconcile request, which the apply then makes.
    _write_manifest(manifest, spec_input(engine={"max_model_len": 4096}))
    before = stored()
    diff = tandemctl("diff", "-f", str(manifest), **cli, check_rc=errors.CHANGES).stdout.splitlines()
    assert diff[:2] == ["deployment ml-research/chat would be updated at once (nothing in it needs approval)",
                        "  engine.max_model_len: 8192 → 4096"]
    assert stored() == before and _queued_tasks(redis_client) == []
    tandemctl("apply", "-f", str(manifest), **cli, check_rc=errors.OK)
    assert stored()[0] == before[0] + 1 and stored()[3] == Status.UPDATING
    assert _queued_tasks(redis_client) == [RECONCILE_TASK]

    # Still rolling out, it can be paused (its nodes stop costing); the pausing pass is what is asked for next.
    paused = tandemctl("pause", "ml-research/chat", **cli, check_rc=errors.OK)
    assert "pausing" in paused.stdout and stored()[3] == Status.PAUSING


def _chat(client: OpenAI, model: str):
    try:
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    except APIStatusError:
        return None  # the gateway caches routes for a moment


@pytest.mark.e2e
def test_exit_codes_a_pipeline_branches_on_and_the_other_commands(stack, tmp_path):
    member = dict(token=stack["tokens"]["member"], server=stack["web"].base_url, home=tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1", "kind": "Deployment",
                                   "metadata": {"team": "ml-research", "name": "chat", "cluster": "k8s-emu"},
                                   "spec": spec_input(engine={"max_model_len": -1})}))
    invalid = tandemctl("apply", "-f", str(bad), **member, check_rc=errors.INVALID)
    assert "max_model_len" in invalid.stderr
    bad.write_text("apiVersion: tandem.dev/v2\nkind: Deployment\n")
    assert "apiVersion must be tandem.dev/v1" in tandemctl("apply", "-f", str(bad), **member,
                                                           check_rc=errors.USAGE).stderr
    tandemctl("get", "ml-research/nothing", **member, check_rc=errors.NOT_FOUND)
    tandemctl("get", **{**member, "token": "tdp_nope_nope"}, check_rc=errors.AUTH)
    bad.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1", "kind": "Deployment",
                                   "metadata": {"team": "ml-research", "name": "chat", "cluster": "k8s-emu"},
                                   "spec": spec_input()}))
    tandemctl("apply", "-f", str(bad), **member, check_rc=errors.PENDING_APPROVAL)
    late = tandemctl("wait", "ml-research/chat", "--timeout", "1", **member, check_rc=errors.TIMED_OUT)
    assert "pending_approval, not running" in late.stderr
    assert Deployment.objects.get(name="chat").status == Status.PENDING_APPROVAL

    # The other commands, each on what the user can see.
    # The factory's model lives in S3, out of the planner's reach: its config.json comes with the command.
    assert "model_facts" in tandemctl("plan", "-f", str(bad), **member, check_rc=errors.INVALID).stderr
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    plan = yaml.safe_load(tandemctl("plan", "-f", str(bad), "--model-config", str(tmp_path / "config.json"),
                                    **member, check_rc=errors.OK).stdout)
    assert plan[0]["deployment"] == "ml-research/chat" and plan[0]["plan"]["pools"]["decode"]["fits"] is True
    latency = plan[0]["plan"]["latency"]  # the expected TTFT with its range, and which profile gave it
    low, high = latency["ttft_ms"]["range_ms"]
    assert low < latency["ttft_ms"]["expected_ms"] < high
    assert latency["profiles"]["prefill"]["kind"] == "scaled, not measured"  # g6e: L40S, from the H200 profile
    assert "h200-20261204-llama8b-qwen32b.json" in latency["profiles"]["prefill"]["source"]
    listed = json.loads(tandemctl("get", "--team", "ml-research", "-o", "json", **member, check_rc=errors.OK).stdout)
    assert [d["name"] for d in listed] == ["chat"]
    assert "requested" in tandemctl("logs", "ml-research/chat", **member, check_rc=errors.OK).stdout
    # The requester may not decide their own request: the API's 403 is an auth error.
    tandemctl("approve", "ml-research/chat", **member, check_rc=errors.AUTH)
    # A request not yet approved cannot pause (the API's 409: not in this state); a paused one resumes (the PD e2e test).
    assert "pending_approval" in tandemctl("pause", "ml-research/chat", **member, check_rc=errors.CONFLICT).stderr
    tandemctl("delete", "ml-research/chat", **member, check_rc=errors.OK)
    assert Deployment.objects.get(name="chat").status == Status.WITHDRAWN
    key = json.loads(tandemctl("keys", "create", "--team", "ml-research", "--name", "k", "-o", "json", **member,
                               check_rc=errors.OK).stdout)
    tandemctl("keys", "revoke", str(key["id"]), **member, check_rc=errors.OK)
    assert key["key_id"] not in tandemctl("keys", "list", "--team", "ml-research", **member, check_rc=errors.OK).stdout


@pytest.mark.e2e
def test_keys_show_their_owner_and_a_team_admin_makes_team_keys_and_moves_keys_to_the_team(
        transactional_db, redis_client, tmp_path, stop_at_end):
    team = TeamFactory(slug="ml-research")
    people = {role: MembershipFactory(team=team, role=role).user for role in Membership.Role}
    web = stop_at_end(start_web(tmp_path))
    member, admin = (dict(token=credential_mint(model=AccessToken, user=people[role], name="ci")[1],
                          server=web.base_url, home=tmp_path) for role in (Membership.Role.MEMBER,
                                                                           Membership.Role.ADMIN))
    refused = tandemctl("keys", "create", "--team", "ml-research", "--name", "svc", "--team-key", **member,
                        check_rc=errors.AUTH)
    assert "Only admins of team ml-research can create team keys" in refused.stderr
    key = json.loads(tandemctl("keys", "create", "--team", "ml-research", "--name", "backend", "-o", "json",
                               **member, check_rc=errors.OK).stdout)
    assert key["owner"] == people[Membership.Role.MEMBER].username
    tandemctl("keys", "transfer", str(key["id"]), **member, check_rc=errors.AUTH)

    moved = tandemctl("keys", "transfer", str(key["id"]), "--message", "chat runs on it", **admin, check_rc=errors.OK)
    assert "backend" in moved.stderr and "is now a key of team ml-research" in moved.stderr
    tandemctl("keys", "create", "--team", "ml-research", "--name", "svc", "--team-key", **admin, check_rc=errors.OK)
    tandemctl("keys", "create", "--team", "ml-research", "--name", "laptop", **admin, check_rc=errors.OK)
    rows = [line.split() for line in tandemctl("keys", "list", "--team", "ml-research", **admin,
                                               check_rc=errors.OK).stdout.splitlines()]
    assert rows[0][:4] == ["ID", "TEAM", "NAME", "OWNER"]
    assert {row[2]: row[3] for row in rows[1:]} == {"backend": "team", "svc": "team",
                                                    "laptop": people[Membership.Role.ADMIN].username}
    assert team.events.get(kind="api_key_transferred").message == "chat runs on it"


def test_the_cli_is_a_client_and_imports_nothing_of_the_server():
    """tandemctl installs on a laptop or a CI runner: it talks HTTP and reads YAML, never Django or the domain."""
    server_side = {"django", "rest_framework", "deployments", "workers", "gateway", "usage", "observability",
                   "frontend", "controlplane"}
    found = [f"{path.name}:{line} imports {module}" for path in sorted((ROOT / "tandemctl").glob("*.py"))
             for line, module in imported_modules(ast.parse(path.read_text()))
             if module.split(".")[0] in server_side]
    assert found == []


@pytest.mark.e2e
def test_approve_shows_the_approver_the_failed_checks_of_the_cluster(transactional_db, redis_client, tmp_path):
    """An approver at the terminal reads what the portal's queue shows: the cluster's failed checks, before the
    request is approved (as the team admin may read them: the cluster's subnets redacted)."""
    from deployments.services.cluster_checks import cluster_check_record, cluster_check_request
    from tests.factories import UserFactory

    team = TeamFactory(slug="ml-research", gpu_quota=16)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    cluster = ClusterFactory(name="eks-prod")
    DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat")
    run = cluster_check_request(actor=UserFactory(is_staff=True, is_superuser=True), cluster=cluster)
    cluster_check_record(check_id=run.pk, lines=[{
        "name": "subnets", "status": "fail", "evidence": "The node subnets span 2 Availability Zones "
        "(us-west-2a: subnet-0a1b2c3d4e5f60718; us-west-2b: subnet-0f1e2d3c4b5a69788).",
        "fix": "Keep the subnets of one zone."}])
    proc = start_web(tmp_path)
    try:
        token = credential_mint(model=AccessToken, user=admin, name="ci")[1]
        run = tandemctl("approve", "ml-research/chat", token=token, server=proc.base_url, home=tmp_path,
                        check_rc=errors.OK)
    finally:
        proc.stop()
    assert "cluster eks-prod fails 1 of its checks (tandemctl doctor eks-prod):" in run.stderr
    assert "  subnets: The node subnets span 2 Availability Zones" in run.stderr
    assert "fix: Keep the subnets of one zone." in run.stderr and "subnet-0a1b2c3d4e5f60718" not in run.stderr
    assert Deployment.objects.get(name="chat").status == "approved"


@pytest.mark.e2e
def test_validate_checks_manifests_against_the_served_schema_and_diff_and_apply_refuse_a_misspelled_field(
        web, tmp_path):
    """For CI: `validate` reads the schema the server serves (public: a CI job needs no token) and writes nothing;
    a misspelled or misplaced field is named (exit 4) by validate, diff and apply alike."""
    cli = dict(token=web["token"], server=web["server"], home=tmp_path)
    anonymous = cli | {"token": None}
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _write_manifest(manifests / "chat.yaml", spec_input())
    _write_manifest(manifests / "typo.yaml", spec_input(
        prefill={"instance_type": "g6e.12xlarge", "nodes": 1, "gpus_per_node": 4, "tensor_parallel_size": 4,
                 "replcas_max": 3}, wake_on_request=True))
    d = web["deployment"]
    before = (Deployment.objects.count(), d.events.count(), Deployment.objects.get(pk=d.pk).spec)

    valid = tandemctl("validate", "-f", str(manifests / "chat.yaml"), **anonymous, check_rc=errors.OK)
    assert valid.stdout == "" and "1 of 1 manifest(s) valid" in valid.stderr
    tandemctl("diff", "-f", str(manifests / "chat.yaml"), **anonymous, check_rc=errors.AUTH)  # it acts as someone
    run = tandemctl("validate", "-f", str(manifests), **anonymous, check_rc=errors.INVALID)
    typo = manifests / "typo.yaml"
    assert run.stdout.splitlines() == [
        f"{typo}: spec.prefill.replcas_max: unknown field; did you mean replicas_max?",
        f"{typo}: spec.wake_on_request: unknown field; it belongs under spec.pause"]
    assert "1 of 2 manifest(s) valid; 1 not" in run.stderr

    for command in ("diff", "apply"):
        refused = tandemctl(command, "-f", str(typo), **cli, check_rc=errors.INVALID)
        assert "  spec.prefill.replcas_max: unknown field; did you mean replicas_max?" in refused.stderr.splitlines()
        assert "  spec.wake_on_request: unknown field; it belongs under spec.pause" in refused.stderr.splitlines()
    assert (Deployment.objects.count(), d.events.count(), Deployment.objects.get(pk=d.pk).spec) == before


def test_describe_shows_why_a_deployment_does_not_serve_one_stage_a_line(live_server, tmp_path):
    """What the cluster reports wrong (workers.diagnosis) is read in full, a stage's cause on each line, not cut
    into a table cell."""
    from deployments.services.status import deployment_observe

    team = TeamFactory(slug="ml-research")
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    d = DeploymentFactory(team=team, cluster=ClusterFactory(), name="chat", status=Status.PROVISIONING)
    why = ['head: ImagePullBackOff: container ray-head cannot pull reg/ray:x: Back-off pulling image "reg/ray:x": '
           "not found", "decode (2 pods): Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]
    deployment_observe(deployment_id=d.pk, condition_updates={"ServeRunning": {
        "status": False, "reason": "ImagePullBackOff", "message": "\n".join(why), "generation": d.generation}})
    token = credential_mint(model=AccessToken, user=member, name="ci")[1]
    out = tandemctl("describe", "ml-research/chat", token=token, server=live_server.url, home=tmp_path,
                    check_rc=errors.OK).stdout
    assert f"ServeRunning  False   ImagePullBackOff  {why[0]} (…)" in out
    assert "Why it does not serve:\n" + "".join(f"  {line}\n" for line in why) in out
