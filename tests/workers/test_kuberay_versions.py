"""What each KubeRay version keeps of Tandem's RayService, and what Tandem does when it is not what it asked for.

The emulator prunes every write with the structural schema of the KubeRay CRD the test names (KubeRay's own CRD
files of 1.4.2, 1.5.1 and 1.6.2 in tests/support/kuberay_crds), as a real API server does; the official client
talks to it over HTTP."""
import httpx
import pytest
import yaml

from deployments.applied_check import applied_differences
from deployments.lifecycle import Status
from deployments.models import Deployment
from tests.factories import DeploymentFactory, TeamFactory
from tests.support.structural_pruning import admit, crd_schema
from tests.support.processes import wait_for
from tests.workers.conftest import TOKEN, gpu_spec
from workers.pipeline import reconcile_pass
from workers.targets.base import PermanentError
from workers.targets.kubernetes import KubernetesTarget

RS = "/apis/ray.io/v1/namespaces/tandem-ml-research/rayservices"


def _rendered(deployment) -> dict:
    return KubernetesTarget(deployment.cluster).desired(deployment)[0][-1]


@pytest.mark.parametrize(("version", "kept"), [("1.4.2", False), ("1.5.1", True), ("1.6.2", True)])
def test_the_emulated_api_server_prunes_what_the_named_kuberay_crd_does_not_declare(emulator, k8s_deployment,
                                                                                    version, kept):
    emulator.kuberay_version = version
    rs = _rendered(k8s_deployment)
    answer = httpx.post(emulator.base_url + RS, json=rs, headers={"Authorization": f"Bearer {TOKEN}"})
    stored = httpx.get(f"{emulator.base_url}{RS}/llama", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    cluster = stored["spec"]["rayClusterConfig"]
    assert [("resources" in g) for g in cluster["workerGroupSpecs"]] == [kept, kept]
    assert ("authOptions" in cluster) is kept
    warnings = answer.headers.get_list("warning")
    assert warnings == ([] if kept else [
        '299 - "unknown field \\"spec.rayClusterConfig.authOptions\\""',
        '299 - "unknown field \\"spec.rayClusterConfig.workerGroupSpecs[0].resources\\""',
        '299 - "unknown field \\"spec.rayClusterConfig.workerGroupSpecs[1].resources\\""'])
    # What every version declares is kept as sent: the serve config, tolerations, container resources.
    assert stored["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"]
    want = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    got = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert (got["tolerations"], got["containers"][0]["resources"]) == \
        (want["tolerations"], want["containers"][0]["resources"])


def test_pruning_follows_the_schema_rules_the_api_server_applies():
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "known": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {"typed": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
            "embedded": {"type": "object", "x-kubernetes-embedded-resource": True,
                         "properties": {"spec": {"type": "object", "properties": {}}}},
            "opts": {"type": "object", "properties": {"surge": {"type": "integer", "default": 100},
                                                      "step": {"type": "integer"}}},
            "absent": {"type": "object", "properties": {"d": {"type": "integer", "default": 1}}},
        }}}}
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "spec": {
        "known": "k", "unknown": 1, "labels": {"any": "v"},
        "free": {"anything": {"deep": 1}, "typed": {"a": 1, "b": 2}},
        "items": [{"n": 1, "m": 2}, {"m": 3}],
        "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "colour": "red"},
                     "spec": {"x": 1}, "y": 2},
        "opts": {"step": 5}}}
    warnings = admit(obj, schema)
    assert obj == {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "spec": {
        "known": "k", "labels": {"any": "v"},
        "free": {"anything": {"deep": 1}, "typed": {"a": 1}},
        "items": [{"n": 1}, {}],
        "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
        "opts": {"step": 5, "surge": 100}}}
    assert warnings == ['unknown field "spec.unknown"', 'unknown field "spec.free.typed.b"',
                        'unknown field "spec.items[0].m"', 'unknown field "spec.items[1].m"',
                        'unknown field "spec.embedded.metadata.colour"', 'unknown field "spec.embedded.spec.x"',
                        'unknown field "spec.embedded.y"']


def test_tandems_rayservice_loses_nothing_on_the_kuberay_it_requires(k8s_deployment):
    rs = _rendered(k8s_deployment)
    for version in ("1.5.1", "1.6.2"):
        kept = yaml.safe_load(yaml.safe_dump(rs))
        assert admit(kept, crd_schema(version)) == [], version


def test_apply_on_kuberay_1_4_2_fails_naming_the_dropped_fields_and_removes_the_rayservice(emulator,
                                                                                         k8s_deployment):
    emulator.kuberay_version = "1.4.2"
    target = KubernetesTarget(k8s_deployment.cluster)
    objects, _ = target.desired(k8s_deployment)
    with pytest.raises(PermanentError) as caught:
        target.apply(k8s_deployment, objects)
    assert str(caught.value) == (
        "KubeRay on k8s-emu dropped spec.rayClusterConfig.authOptions (needs KubeRay ≥ 1.5.1), "
        "spec.rayClusterConfig.workerGroupSpecs[].resources (needs KubeRay ≥ 1.5.0): its RayService CRD does not "
        "declare them. Upgrade KubeRay's CRDs and operator to 1.5.1 or newer, then retry. The RayService was removed.")
    assert emulator.rayservices() == []


@pytest.fixture
def approved(k8s_cluster, redis_client):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    return DeploymentFactory(team=team, cluster=k8s_cluster, name="llama", spec=gpu_spec(), status=Status.APPROVED)


def test_a_deployment_fails_in_one_pass_on_kuberay_1_4_2(emulator, approved):
    emulator.kuberay_version = "1.4.2"
    assert reconcile_pass(approved.pk) is None
    d = Deployment.objects.get(pk=approved.pk)
    assert d.status == Status.FAILED
    assert "workerGroupSpecs[].resources (needs KubeRay ≥ 1.5.0)" in d.status_reason
    assert "Upgrade KubeRay's CRDs and operator to 1.5.1 or newer" in d.status_reason
    assert emulator.rayservices() == []


def test_the_same_deployment_runs_on_kuberay_1_5_1(emulator, approved):
    emulator.kuberay_version = "1.5.1"
    wait_for(lambda: reconcile_pass(approved.pk) is None and
             Deployment.objects.get(pk=approved.pk).status == Status.RUNNING, timeout=30, what="running")
    rs = emulator.rayservices()[0]["spec"]["rayClusterConfig"]
    assert rs["authOptions"] == {"mode": "token"}
    assert [g["resources"] for g in rs["workerGroupSpecs"]] == [{"prefill_pool": "4"}, {"decode_pool": "4"}]


def test_a_value_tandem_relies_on_changed_after_apply_fails_it_and_other_changes_do_not():
    asked = {"serveConfigV2": "applications: []", "rayClusterConfig": {"workerGroupSpecs": [
        {"resources": {"prefill_pool": "8"}, "template": {"spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"image": "rayproject/ray-llm:2.60.0-py312-cu128",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}]}}
    mirrored = yaml.safe_load(yaml.safe_dump(asked))
    group = mirrored["rayClusterConfig"]["workerGroupSpecs"][0]
    group["template"]["spec"]["containers"][0]["image"] = "mirror.example/ray-llm:2.60.0-py312-cu128"
    group["template"]["spec"]["tolerations"].append({"key": "extra", "operator": "Exists"})  # an addition
    assert applied_differences(asked, mirrored) == ([], [])
    group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    mirrored["serveConfigV2"] = "applications: [other]"
    assert applied_differences(asked, mirrored) == (
        [], ["serveConfigV2", "rayClusterConfig.workerGroupSpecs[].template.spec.containers[].resources.limits."
                              "nvidia.com/gpu"])


def _running(target, deployment) -> None:
    target.apply(deployment, target.desired(deployment)[0])
    wait_for(lambda: target.observe(deployment).serve_status == "RUNNING", timeout=10, what="RUNNING")


def test_an_update_is_read_back_and_a_value_a_webhook_changed_fails_it(emulator, k8s_deployment):
    """A mutating webhook (a policy engine) strips the GPU toleration from what is stored on the next write: the
    replace is read back like a create, and the deployment fails naming the field rather than wait for pods that
    can never schedule."""
    target = KubernetesTarget(k8s_deployment.cluster)
    _running(target, k8s_deployment)

    def strip_tolerations(rs: dict) -> None:
        for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            group["template"]["spec"]["tolerations"] = []

    emulator.mutations.append(strip_tolerations)
    k8s_deployment.spec["engine"]["max_model_len"] = 4096  # a serve config change: replaced in place
    with pytest.raises(PermanentError) as caught:
        target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert "rayClusterConfig.workerGroupSpecs[].template.spec.tolerations" in str(caught.value)
    assert emulator.rayservices() == []


def test_until_kuberay_acts_on_an_update_its_old_status_is_not_taken_for_the_new_spec(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    _running(target, k8s_deployment)
    emulator.operator_enabled = False  # KubeRay has not reconciled since the write
    k8s_deployment.spec["engine"]["max_model_len"] = 4096
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    stored = emulator.rayservices()[0]
    assert stored["metadata"]["generation"] == 2 and stored["status"]["observedGeneration"] == 1
    assert stored["status"]["activeServiceStatus"]["applicationStatuses"]["llama"]["status"] == "RUNNING"
    observed = target.observe(k8s_deployment)
    assert (observed.serve_status, observed.message) == ("DEPLOYING", "KubeRay has not acted on the latest spec yet.")
    emulator.operator_enabled = True
    wait_for(lambda: target.observe(k8s_deployment).serve_status == "RUNNING", timeout=10, what="RUNNING again")
