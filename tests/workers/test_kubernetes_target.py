"""The kubernetes driver over real HTTP: the official client against the emulated API server with KubeRay."""
import re
import time

import pytest

from tests.factories import DeploymentFactory
from tests.workers.conftest import TOKEN
from workers.targets.base import PermanentError, TransientError
from workers.targets.kubernetes import KubernetesTarget

RS_PATH = r"/apis/ray\.io/v1/namespaces/tandem-ml-research/rayservices"


def writes(emulator):
    return [h for h in emulator.hits if h[0] in ("POST", "PUT", "PATCH", "DELETE")]


def apply(target, deployment):
    objects, _ = target.desired(deployment)
    return target.apply(deployment, objects)


def test_apply_creates_namespace_service_and_rayservice_then_repeats_as_a_no_op(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    assert target.observe(k8s_deployment).exists is False
    first = apply(target, k8s_deployment)
    assert "created RayService tandem-ml-research/llama" in first.message
    count = len(writes(emulator))
    second = apply(KubernetesTarget(k8s_deployment.cluster), k8s_deployment)
    assert second.message.startswith("nothing changed")
    assert len(writes(emulator)) == count
    assert len(emulator.rayservices()) == 1
    assert {"v1/namespaces", "rbac.authorization.k8s.io/v1/rolebindings", "networking.k8s.io/v1/networkpolicies",
            "v1/serviceaccounts", "v1/services", "ray.io/v1/rayservices"} == {r for r, _, _ in emulator.live_objects()}


def test_a_cluster_without_a_registered_image_runs_the_public_one_by_tag_and_the_applied_event_says_so(
        emulator, k8s_deployment):
    """No KV over EFA (kv_transport tcp): the runtime's public Ray LLM image, on the head and both pools."""
    from deployments.catalog import RUNTIMES

    cluster = k8s_deployment.cluster
    cluster.config = {k: v for k, v in cluster.config.items() if k != "runtime_images"}
    cluster.save()
    k8s_deployment.spec["engine"]["kv_transport"] = "tcp"
    target = KubernetesTarget(cluster)
    step = apply(target, k8s_deployment)
    public = RUNTIMES[k8s_deployment.spec_typed.runtime].base_image
    assert f"its Ray pods run the public image {public} by tag" in step.message
    cluster_part = emulator.rayservices()[0]["spec"]["rayClusterConfig"]
    assert {g["template"]["spec"]["containers"][0]["image"]
            for g in [cluster_part["headGroupSpec"], *cluster_part["workerGroupSpecs"]]} == {public}
    k8s_deployment.spec["engine"]["kv_transport"] = "efa"  # NIXL's LIBFABRIC backend: not in that image
    with pytest.raises(PermanentError, match="the public Ray LLM image has no libfabric"):
        target.desired(k8s_deployment)
    for _ in range(5):  # deleting needs no image
        if target.teardown(k8s_deployment).ready:
            break
    assert emulator.rayservices() == []


def test_status_follows_ready_and_application_statuses(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    _, desired_hash = target.desired(k8s_deployment)
    observed = target.observe(k8s_deployment)
    assert (observed.serve_status, observed.applied_hash) == ("DEPLOYING", desired_hash)
    assert target.endpoint_answers(k8s_deployment, observed).ready is False
    time.sleep(0.35)
    observed = target.observe(k8s_deployment)
    assert observed.serve_status == "RUNNING"
    assert observed.endpoint_url == "http://llama-endpoint.tandem-ml-research.svc.cluster.local:8000"
    assert target.endpoint_answers(k8s_deployment, observed).ready is True


def test_an_update_replaces_only_the_rayservice_and_status_waits_for_the_new_generation(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    time.sleep(0.35)
    assert target.observe(k8s_deployment).serve_status == "RUNNING"
    before = len(writes(emulator))
    k8s_deployment.spec["engine"]["max_model_len"] = 4096
    step = apply(target, k8s_deployment)
    assert step.message == ("updated RayService tandem-ml-research/llama (unchanged: Namespace, RoleBinding, "
                            "NetworkPolicy, NetworkPolicy, ServiceAccount, Service)")
    assert [m for m, _ in writes(emulator)[before:]] == ["PUT"]
    rs = emulator.rayservices()[0]
    assert rs["metadata"]["generation"] == 2 and "max_model_len: 4096" in rs["spec"]["serveConfigV2"]
    assert target.observe(k8s_deployment).serve_status == "DEPLOYING"


def test_a_change_to_the_ray_cluster_recreates_the_rayservice_and_says_so(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    before, uid = len(writes(emulator)), emulator.rayservices()[0]["metadata"]["uid"]
    k8s_deployment.spec["decode"]["nodes"] = 2
    step = apply(target, k8s_deployment)
    assert step.message.startswith("recreated RayService tandem-ml-research/llama: its Ray cluster changed, which "
                                   "KubeRay does not upgrade in place")
    assert [m for m, _ in writes(emulator)[before:]] == ["DELETE", "POST"]
    rs = emulator.rayservices()[0]
    assert rs["metadata"]["uid"] != uid and rs["spec"]["upgradeStrategy"] == {"type": "None"}
    assert [g["replicas"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]] == [1, 2]
    assert target.observe(k8s_deployment).serve_status == "DEPLOYING"


@pytest.mark.parametrize(("method", "path", "status", "headers", "retry_after"), [
    ("PUT", RS_PATH, 409, {}, None),              # someone else wrote the RayService in between
    ("GET", RS_PATH, 429, {"Retry-After": "7"}, 7.0),
    ("GET", RS_PATH, 500, {}, None),
    ("GET", RS_PATH, 410, {}, None),              # Gone: a stale resourceVersion / expired watch
    ("POST", RS_PATH, 503, {}, None),
])
def test_transient_api_errors_are_classified_for_retry(emulator, k8s_deployment, method, path, status, headers,
                                                       retry_after):
    target = KubernetesTarget(k8s_deployment.cluster)
    if method == "PUT":
        apply(target, k8s_deployment)
        k8s_deployment.spec["engine"]["max_model_len"] = 4096
    emulator.inject(method, path, status, headers=headers)
    with pytest.raises(TransientError) as caught:
        apply(target, k8s_deployment)
    assert caught.value.retry_after == retry_after
    assert str(status) in str(caught.value) or "throttling" in str(caught.value)
    apply(target, k8s_deployment)  # the fault was one-off: the retry converges
    assert len(emulator.rayservices()) == 1


def test_a_concurrent_writer_makes_the_replace_conflict(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    objects, _ = target.desired(k8s_deployment)
    stale = target._read(objects[-1])
    emulator.objects[list(k for k in emulator.objects if k[2] == "llama")[0]].patch(
        {"metadata": {"resourceVersion": "999"}})
    with pytest.raises(TransientError, match="409"):
        target._replace(objects[-1], stale)


def test_missing_kuberay_is_permanent_and_says_what_to_install(emulator, k8s_deployment):
    del emulator.resources["ray.io/v1/rayservices"]
    with pytest.raises(PermanentError, match="KubeRay is not installed.*Install KubeRay 1.5.1"):
        apply(KubernetesTarget(k8s_deployment.cluster), k8s_deployment)


def test_rejected_credentials_are_permanent_and_the_token_is_not_in_the_message(emulator, k8s_deployment, tmp_path):
    emulator.token = "another-token"
    with pytest.raises(PermanentError, match="refused Tandem's credentials") as caught:
        KubernetesTarget(k8s_deployment.cluster).observe(k8s_deployment)
    assert TOKEN not in str(caught.value)


def test_an_invalid_manifest_is_permanent(emulator, k8s_deployment):
    emulator.inject("POST", RS_PATH, 422)
    with pytest.raises(PermanentError, match="rejected the manifest"):
        apply(KubernetesTarget(k8s_deployment.cluster), k8s_deployment)


def test_an_unreachable_api_server_is_transient(k8s_deployment, tmp_path):
    path = tmp_path / "dead-kubeconfig"
    from tests.support.k8s_emulator import kubeconfig_text

    path.write_text(kubeconfig_text(url="http://127.0.0.1:9", token=TOKEN))
    k8s_deployment.cluster.secret_ref = f"file:{path}"
    with pytest.raises(TransientError, match="Cannot reach"):
        KubernetesTarget(k8s_deployment.cluster).observe(k8s_deployment)


def test_teardown_deletes_everything_and_confirms_it_is_gone(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    step = target.teardown(k8s_deployment)
    assert step.ready, step.message
    assert emulator.live_objects() == []
    assert target.teardown(k8s_deployment).ready  # again: nothing to do, still done


def _foreign_namespace(emulator, labels: dict | None = None):
    """A namespace with the team's name that someone else made (a platform team's, another product's)."""
    emulator.namespaces["tandem-ml-research"] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "tandem-ml-research", "labels": labels or {"owner": "payments"}}}


@pytest.mark.parametrize("labels", [None, {"app.kubernetes.io/managed-by": "tandem", "tandem.dev/team": "other"}],
                         ids=["not-tandems", "another-teams"])
def test_an_existing_namespace_that_is_not_this_teams_is_refused_never_adopted_or_deleted(emulator, k8s_deployment,
                                                                                            labels):
    _foreign_namespace(emulator, labels)
    with pytest.raises(PermanentError, match="Namespace tandem-ml-research already exists .* will not adopt"):
        apply(KubernetesTarget(k8s_deployment.cluster), k8s_deployment)
    assert emulator.namespaces["tandem-ml-research"]["metadata"]["labels"] == (labels or {"owner": "payments"})
    assert emulator.rayservices() == []
    assert KubernetesTarget(k8s_deployment.cluster).teardown(k8s_deployment).ready
    assert "tandem-ml-research" in emulator.namespaces


def test_a_namespace_made_by_someone_else_between_read_and_create_is_refused(emulator, k8s_deployment):
    """The 409 on create is not taken as ours: the namespace is read back and its labels checked."""
    target = KubernetesTarget(k8s_deployment.cluster)
    objects, _ = target.desired(k8s_deployment)
    _foreign_namespace(emulator)
    with pytest.raises(PermanentError, match="not Tandem's"):
        target._create(objects[0])
    assert emulator.namespaces["tandem-ml-research"]["metadata"]["labels"] == {"owner": "payments"}


def test_deleting_one_of_a_teams_deployments_finishes_and_leaves_the_other_and_the_namespace(emulator,
                                                                                              k8s_deployment):
    other = DeploymentFactory(team=k8s_deployment.team, cluster=k8s_deployment.cluster, name="mistral")
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    apply(target, other)
    assert target.teardown(k8s_deployment).ready
    assert [rs["metadata"]["name"] for rs in emulator.rayservices()] == ["mistral"]
    assert "tandem-ml-research" in emulator.namespaces


def _secrets(emulator) -> list[dict]:
    return [o.raw for (res, _, _), o in list(emulator.objects.items()) if res.plural == "secrets" and not o.deleted]


def test_the_teams_hugging_face_token_is_copied_into_its_namespace_before_the_rayservice_and_never_shown(
        emulator, k8s_deployment, monkeypatch):
    import base64
    import json

    monkeypatch.setenv("TANDEM_CLUSTER_HF_ML_RESEARCH", "hf_gated_token_value_1")
    k8s_deployment.cluster.config["hf_token_refs"] = {"ml-research": "env:TANDEM_CLUSTER_HF_ML_RESEARCH"}
    target = KubernetesTarget(k8s_deployment.cluster)
    objects, _ = target.desired(k8s_deployment)
    step = target.apply(k8s_deployment, objects)
    assert "copied team ml-research's Hugging Face token into Secret tandem-ml-research/tandem-model-access" in \
        step.message
    [secret] = _secrets(emulator)
    assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == "hf_gated_token_value_1"
    assert secret["metadata"]["namespace"] == "tandem-ml-research"
    posts = [p for m, p in writes(emulator) if m == "POST"]
    assert posts.index("/api/v1/namespaces/tandem-ml-research/secrets") < \
        posts.index("/apis/ray.io/v1/namespaces/tandem-ml-research/rayservices")
    assert "hf_gated_token_value" not in json.dumps(objects) + step.message
    # Rotated: the next apply replaces it.
    monkeypatch.setenv("TANDEM_CLUSTER_HF_ML_RESEARCH", "hf_gated_token_value_2")
    k8s_deployment.spec["engine"]["max_model_len"] = 4096
    step = target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert "refreshed team ml-research's Hugging Face token" in step.message
    assert base64.b64decode(_secrets(emulator)[0]["data"]["HF_TOKEN"]).decode() == "hf_gated_token_value_2"


def test_a_team_without_a_token_gets_no_secret_and_an_unreadable_reference_fails_without_the_value(
        emulator, k8s_deployment, monkeypatch):
    target = KubernetesTarget(k8s_deployment.cluster)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert _secrets(emulator) == []
    monkeypatch.delenv("TANDEM_CLUSTER_HF_ML_RESEARCH", raising=False)
    k8s_deployment.cluster.config["hf_token_refs"] = {"ml-research": "env:TANDEM_CLUSTER_HF_ML_RESEARCH"}
    with pytest.raises(PermanentError, match="Hugging Face token of team ml-research on k8s-emu cannot be read: "
                                             "The environment variable named by"):
        target.apply(k8s_deployment, target.desired(k8s_deployment)[0])


def test_the_engines_logs_are_read_per_stage_from_the_deployments_worker_pods(emulator, k8s_deployment):
    """What the conformance run reads for the NIXL backend each stage uses (observability.fabric): the worker pods
    of the deployment's prefill and decode groups, found by Tandem's labels, others' pods left out."""
    from kubernetes import client as k8s

    from observability.fabric import nixl_backends
    from tests.support.cluster_addons import emulator_client

    emulator.resources["v1/pods"] = {"kind": "Pod", "namespaced": True, "subresources": ["log"]}
    core = k8s.CoreV1Api(emulator_client(emulator, token=TOKEN))
    pods = {"llama-prefill-0": ("llama", "prefill", "Backend LIBFABRIC was instantiated\n"),
            "llama-decode-0": ("llama", "decode", "Skipping backend registration LIBFABRIC due to the missing plugin.\n"
                                                  "Backend UCX was instantiated\n"),
            "other-prefill-0": ("other", "prefill", "Backend UCX was instantiated\n")}
    for name, (deployment, stage, log) in pods.items():
        core.create_namespaced_pod("tandem-ml-research", {"metadata": {"name": name, "labels": {
            "tandem.dev/deployment": deployment, "tandem.dev/pool": stage}}, "spec": {"containers": []}})
        emulator.pod_logs[("tandem-ml-research", name)] = log
    logs = KubernetesTarget(k8s_deployment.cluster).engine_logs(k8s_deployment)
    assert {stage: nixl_backends(text) for stage, text in logs.items()} == {
        "prefill": {"instantiated": ["LIBFABRIC"], "missing": []},
        "decode": {"instantiated": ["UCX"], "missing": ["LIBFABRIC"]}}


RB_COLLECTION = "/apis/rbac.authorization.k8s.io/v1/namespaces/tandem-ml-research/rolebindings"
RB_PATH = re.escape(RB_COLLECTION) + "/tandem-worker$"


def _selects(selector: dict | None, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions) as Kubernetes matches it; an absent one matches nothing
    here (a peer leaves it out only beside the other selector, handled by the caller)."""
    ops = {"In": lambda v, vs: v in vs, "NotIn": lambda v, vs: v not in vs}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and all(
        e["key"] in labels and ops[e["operator"]](labels[e["key"]], e["values"])
        for e in selector.get("matchExpressions") or [])


def reaches(policies: list[dict], *, namespace: str, namespace_labels: dict, pod_labels: dict, port: int,
            to_namespace: str = "tandem-ml-research") -> bool:
    """Whether a pod may open a TCP connection to `port` of a pod in `to_namespace` under these NetworkPolicies
    (networking.k8s.io/v1 ingress semantics: without a policy selecting the pod everything is let in; with one,
    what some rule of some policy lets in; a peer with only a podSelector means pods of the policy's namespace)."""
    selecting = [p for p in policies if p["metadata"]["namespace"] == to_namespace and "Ingress" in
                 p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], {"any": "pod"})]
    if not selecting:
        return True

    def peer_matches(peer: dict) -> bool:
        if "namespaceSelector" not in peer:
            return namespace == to_namespace and _selects(peer["podSelector"], pod_labels)
        return _selects(peer["namespaceSelector"], namespace_labels) and _selects(peer.get("podSelector", {}),
                                                                                  pod_labels)
    return any((not rule.get("from") or any(peer_matches(peer) for peer in rule["from"])) and
               (not rule.get("ports") or any(p["port"] == port and p["protocol"] == "TCP" for p in rule["ports"]))
               for policy in selecting for rule in policy["spec"].get("ingress") or [])


def _control_plane_pod(component: str) -> dict:
    """The labels deploy/ gives Tandem's own pods (the eks overlay)."""
    from tests.deploy.render import find, render
    return find(render("eks"), "Deployment", f"tandem-{component}")["spec"]["template"]["metadata"]["labels"]


def _ns(name: str, **labels) -> dict:
    return {"kubernetes.io/metadata.name": name, **labels}  # the API server sets the name label on every namespace


@pytest.mark.parametrize("prometheus", [{}, {"kubernetes.io/metadata.name": "monitoring"}])
def test_only_the_gateway_workers_kuberay_prometheus_and_the_teams_own_pods_reach_its_ray_pods(
        emulator, k8s_deployment, settings, prometheus):
    settings.TANDEM_PROMETHEUS_NAMESPACE_LABELS = prometheus
    apply(KubernetesTarget(k8s_deployment.cluster), k8s_deployment)
    policies = [o.raw for (res, _, _), o in emulator.objects.items() if res.plural == "networkpolicies"]
    gateway, worker = _control_plane_pod("gateway"), _control_plane_pod("worker")
    tandem = {"namespace": "tandem", "namespace_labels": _ns("tandem")}
    team = {"namespace": "tandem-ml-research", "namespace_labels": _ns("tandem-ml-research")}
    other_team = {"namespace": "tandem-other", "namespace_labels": _ns("tandem-other", **{
        "app.kubernetes.io/managed-by": "tandem", "tandem.dev/team": "other"})}
    kuberay = {"namespace": "kuberay-system", "namespace_labels": _ns("kuberay-system"),
               "pod_labels": {"app.kubernetes.io/name": "kuberay-operator"}}
    monitoring = {"namespace": "monitoring", "namespace_labels": _ns("monitoring"), "pod_labels": {"app": "prom"}}
    allowed = [({**tandem, "pod_labels": gateway}, 8000), ({**tandem, "pod_labels": worker}, 8000),
               ({**tandem, "pod_labels": worker}, 8080), (kuberay, 8000), (kuberay, 8265),
               ({**team, "pod_labels": {"ray.io/node-type": "worker"}}, 6379),  # Ray's own traffic: GCS,
               ({**team, "pod_labels": {"ray.io/node-type": "worker"}}, 5600)]  # NIXL between prefill and decode
    refused = [({**tandem, "pod_labels": gateway}, 8265),  # the dashboard runs jobs: not the gateway's
               ({**tandem, "pod_labels": {"app.kubernetes.io/name": "tandem", "app.kubernetes.io/component": "web"}},
                8000),
               ({**other_team, "pod_labels": {"ray.io/node-type": "head"}}, 8000),  # another team's pods
               ({"namespace": "default", "namespace_labels": _ns("default"), "pod_labels": gateway}, 8000),
               ({**kuberay, "namespace": "default", "namespace_labels": _ns("default")}, 8265),
               ({**monitoring}, 8000)]
    (allowed if prometheus else refused).append((monitoring, 8080))
    assert [(src["namespace"], port) for src, port in allowed if not reaches(policies, **src, port=port)] == []
    assert [(src["namespace"], port) for src, port in refused if reaches(policies, **src, port=port)] == []


def test_the_rolebinding_and_policies_come_with_the_namespace_and_come_back_once_removed(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    # A real API server answers 403 to a read of the RoleBinding before it exists: the worker has no right there yet.
    emulator.inject("GET", RB_PATH, 403)
    step = apply(target, k8s_deployment)
    assert emulator.faults[0].count == 0
    assert "created RoleBinding tandem-ml-research/tandem-worker" in step.message
    binding = next(o.raw for (res, _, _), o in emulator.objects.items() if res.plural == "rolebindings")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "tandem-team-namespace"}
    assert target.observe(k8s_deployment).applied_hash == target.desired(k8s_deployment)[1]
    # A namespace made before Tandem bound itself in team namespaces (or whose binding someone removed): the pass
    # sees it missing without reading what it may not read, and puts the binding and the policies back.
    for (res, _, _), obj in list(emulator.objects.items()):
        if res.plural in ("rolebindings", "networkpolicies"):
            obj.delete()
    mark = len(emulator.hits)
    observed = target.observe(k8s_deployment)
    assert observed.applied_hash == "" and "RoleBinding in namespace tandem-ml-research is missing" in observed.message
    assert [p for _, p in emulator.hits[mark:]] == ["/api/v1/namespaces/tandem-ml-research",
                                                     "/apis/rbac.authorization.k8s.io/v1/namespaces/tandem-ml-research/"
                                                     "rolebindings/tandem-worker"]
    step = apply(target, k8s_deployment)
    assert step.message.startswith("created RoleBinding tandem-ml-research/tandem-worker; created NetworkPolicy "
                                   "tandem-ml-research/tandem-default-deny; created NetworkPolicy "
                                   "tandem-ml-research/tandem-ingress (unchanged: Namespace,")
    assert target.observe(k8s_deployment).applied_hash == target.desired(k8s_deployment)[1]


def test_a_binding_there_that_tandem_may_not_read_is_a_permanent_error_saying_what_to_delete(emulator,
                                                                                          k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    emulator.inject("GET", RB_PATH, 403, count=2)  # someone rewrote its subjects: the worker lost its rights there
    with pytest.raises(PermanentError, match="kubectl -n tandem-ml-research delete rolebinding tandem-worker"):
        apply(target, k8s_deployment)


def test_a_binding_another_worker_made_between_read_and_create_is_taken_as_made(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    emulator.inject("GET", RB_PATH, 404)  # not there when this worker looked; there when it creates it
    apply(target, k8s_deployment)
    assert [h for h in emulator.hits if h == ("POST", RB_COLLECTION)] == [("POST", RB_COLLECTION)] * 2  # 2nd: 409


def test_a_team_namespace_is_never_relabelled_or_rewritten(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    emulator.namespaces["tandem-ml-research"]["metadata"]["annotations"] = {"tandem.dev/spec-hash": "old"}
    mark = len(emulator.hits)
    assert target.observe(k8s_deployment).applied_hash == target.desired(k8s_deployment)[1]
    assert apply(target, k8s_deployment).message.startswith("nothing changed")
    assert [m for m, p in emulator.hits[mark:] if p.startswith("/api/v1/namespaces/tandem-ml-research") and
            p.count("/") == 4] == ["GET", "GET"]


def test_a_team_namespace_still_being_deleted_is_waited_for_before_anything_is_written_in_it(emulator,
                                                                                            k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    apply(target, k8s_deployment)
    emulator.namespaces["tandem-ml-research"]["metadata"]["deletionTimestamp"] = "2026-12-05T07:00:00Z"
    mark = len(writes(emulator))
    with pytest.raises(TransientError, match="Namespace tandem-ml-research is still being deleted"):
        apply(target, k8s_deployment)
    assert writes(emulator)[mark:] == []
