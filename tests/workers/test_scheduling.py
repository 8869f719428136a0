"""Ray pods against the nodes a cluster really has: the emulated KubeRay makes the RayService's pods, the emulated
scheduler places them by allocatable (GPUs, EFA devices, hugepages, CPU, memory), taints and node selectors, and a
pod that fits nowhere stays Pending with the scheduler's message, which the deployment shows in its conditions."""
import pytest
from kubernetes import client as k8s

from deployments.conditions import condition_get
from deployments.lifecycle import Status
from deployments.manifests import EFA_HUGEPAGES, manifests_build
from deployments.spec import spec_parse
from deployments.models import Deployment
from tests.factories import RUNTIME_IMAGE, DeploymentFactory, TeamFactory, spec_input
from tests.support.processes import wait_for
from tests.support.scheduler import cpu_node, eks_node, pod_requests, schedule
from tests.workers.conftest import gpu_spec
from workers.diagnosis import findings_text
from workers.pipeline import reconcile_pass
from workers.targets.kubernetes import KubernetesTarget

NO_GPU = ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient "
          "nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
          "2 No preemption victims found for incoming pod.")


def _why(target, deployment) -> str:
    """What the deployment's pods and Serve report wrong, as its ServeRunning condition says it."""
    return findings_text(target.diagnose(deployment, target.observe(deployment)))


def _gpu_nodes(**kwargs):
    return [eks_node(f"ip-10-0-0-{i}", "g6e.12xlarge", hugepages_2mi=EFA_HUGEPAGES, **kwargs) for i in (1, 2)]


@pytest.fixture
def approved(k8s_cluster, redis_client):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    return DeploymentFactory(team=team, cluster=k8s_cluster, name="llama", spec=gpu_spec(), status=Status.APPROVED)


def _serve_condition(d) -> dict:
    return condition_get(Deployment.objects.get(pk=d.pk).conditions, "ServeRunning")


def test_without_the_nvidia_device_plugin_the_workers_stay_pending_and_the_deployment_says_why(emulator, approved):
    emulator.nodes = [cpu_node("ip-10-0-9-9"), *_gpu_nodes(gpu_plugin=False)]
    for _ in range(3):
        assert reconcile_pass(approved.pk) is not None  # comes back: still provisioning
    d = Deployment.objects.get(pk=approved.pk)
    assert d.status == Status.PROVISIONING
    pods = {p["metadata"]["labels"]["tandem.dev/pool"]: p for p in emulator.pods("tandem-ml-research")}
    assert pods["head"]["status"]["phase"] == "Running"
    for pool in ("prefill", "decode"):
        assert pods[pool]["status"]["phase"] == "Pending"
        assert pods[pool]["status"]["conditions"][0]["message"] == NO_GPU
    condition = _serve_condition(approved)
    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert condition["message"].splitlines() == [f"prefill: Unschedulable: {NO_GPU}", f"decode: Unschedulable: {NO_GPU}"]
    assert d.events.filter(kind="not_serving", message__contains="Insufficient nvidia.com/gpu").exists()
    # The device plugin starts on the nodes: the pods are placed and the deployment goes on to serve.
    emulator.nodes[1:] = _gpu_nodes()
    wait_for(lambda: reconcile_pass(approved.pk) is None and
             Deployment.objects.get(pk=approved.pk).status == Status.RUNNING, timeout=30, what="running")
    assert {p["spec"]["nodeName"] for p in emulator.pods() if "worker" in p["metadata"]["name"]} == \
        {"ip-10-0-0-1", "ip-10-0-0-2"}


def test_a_taint_the_pods_do_not_tolerate_keeps_them_pending_with_the_taint_named(emulator, k8s_deployment):
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    emulator.nodes = [cpu_node("ip-10-0-9-9"), *_gpu_nodes(taints=[taint])]
    target = KubernetesTarget(k8s_deployment.cluster)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert target.observe(k8s_deployment).serve_status == "DEPLOYING"
    why = ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) had untolerated "
           "taint {dedicated: training}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
           "scheduling.")
    assert f"decode: Unschedulable: {why}" in _why(target, k8s_deployment).splitlines()


def test_a_node_without_the_efa_device_plugin_is_no_fit_for_an_efa_pool(emulator, k8s_deployment):
    emulator.nodes = [cpu_node("ip-10-0-9-9"), *_gpu_nodes(efa_plugin=False)]
    target = KubernetesTarget(k8s_deployment.cluster)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient "
            "vpc.amazonaws.com/efa.") in _why(target, k8s_deployment)


@pytest.mark.parametrize(("hugepages", "fits"), [(EFA_HUGEPAGES, True), ("", False)])
def test_an_eks_efa_worker_fits_only_a_node_that_reserved_its_hugepages(hugepages, fits):
    spec = spec_parse(spec_input(), target_kind="eks")
    rs = manifests_build(name="llama", namespace="tandem-t", team_slug="t", spec=spec, target_kind="eks",
                         image=RUNTIME_IMAGE)[-1]
    worker = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    node, message = schedule(worker, [eks_node("ip-10-0-0-1", "g6e.12xlarge", hugepages_2mi=hugepages)])
    assert (node is not None, message) == (fits, "" if fits else (
        "0/1 nodes are available: 1 Insufficient hugepages-2Mi. preemption: 0/1 nodes are available: 1 No "
        "preemption victims found for incoming pod."))


def test_pods_compete_for_a_fixed_fleet_and_a_deleted_rayservice_frees_its_nodes(emulator, k8s_deployment):
    emulator.nodes = [cpu_node("ip-10-0-9-9"), *_gpu_nodes()]
    target = KubernetesTarget(k8s_deployment.cluster)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert "Unschedulable" not in _why(target, k8s_deployment)
    other = DeploymentFactory(team=k8s_deployment.team, cluster=k8s_deployment.cluster, name="mistral")
    target.apply(other, target.desired(other)[0])
    assert "2 Insufficient nvidia.com/gpu" in _why(target, other)  # the first one holds both nodes
    assert target.teardown(k8s_deployment).ready
    assert "Unschedulable" not in _why(target, other)


def test_the_scheduler_counts_requests_of_every_container_and_the_largest_init_container():
    spec = {"containers": [{"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                           {"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}}]}
    wanted = pod_requests(spec)
    assert (wanted["cpu"], wanted["memory"], wanted["nvidia.com/gpu"], wanted["pods"]) == (3, 1024 ** 3, 1, 1)
    node, message = schedule({**spec, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                              "nodeSelector": {"node.kubernetes.io/instance-type": "g6e.xlarge"}},
                             [eks_node("a", "g6e.xlarge")])
    assert (node.name, message) == ("a", "")


def _running(target, deployment):
    wait_for(lambda: target.observe(deployment).serve_status == "RUNNING", timeout=10, what="RUNNING")


def test_kuberays_default_upgrade_never_completes_on_a_full_fleet_so_tandem_recreates(emulator, k8s_deployment):
    emulator.nodes = [cpu_node("ip-10-0-9-9"), *_gpu_nodes()]
    target = KubernetesTarget(k8s_deployment.cluster)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    _running(target, k8s_deployment)
    # The trap: the same RayService under KubeRay's default strategy, its pools changed. The second Ray cluster
    # has no room beside the first, the old one goes on serving, and the RayService reads as Ready for ever.
    custom = k8s.CustomObjectsApi(target.api)
    rs = custom.get_namespaced_custom_object("ray.io", "v1", "tandem-ml-research", "rayservices", "llama")
    del rs["spec"]["upgradeStrategy"]
    worker = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = worker["resources"]["requests"]["nvidia.com/gpu"] = "2"
    custom.replace_namespaced_custom_object("ray.io", "v1", "tandem-ml-research", "rayservices", "llama", rs)
    for _ in range(2):
        observed = target.observe(k8s_deployment)
    stored = custom.get_namespaced_custom_object("ray.io", "v1", "tandem-ml-research", "rayservices", "llama")
    assert next(c for c in stored["status"]["conditions"] if c["type"] == "UpgradeInProgress")["status"] == "True"
    assert observed.serve_status == "RUNNING"  # what Tandem would have shown
    pending = {p["metadata"]["labels"]["tandem.dev/pool"]: p["status"]["conditions"][0]["message"]
               for p in emulator.pods() if p["status"]["phase"] == "Pending"}
    assert set(pending) == {"head", "prefill", "decode"}  # all of the second cluster
    assert pending["decode"].startswith("0/3 nodes are available: 1 node(s) didn't match Pod's node "
                                        "affinity/selector, 2 Insufficient cpu, 2 Insufficient memory, 2 Insufficient "
                                        "nvidia.com/gpu, 2 Insufficient vpc.amazonaws.com/efa.")
    # Tandem's own update of the decode pool: an announced recreation, which fits.
    target.teardown(k8s_deployment)
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    _running(target, k8s_deployment)
    k8s_deployment.spec["decode"].update(gpus_per_node=2, tensor_parallel_size=2)
    step = target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert step.message.startswith("recreated RayService tandem-ml-research/llama: its Ray cluster changed")
    _running(target, k8s_deployment)
    decode = [p for p in emulator.pods() if p["metadata"]["labels"]["tandem.dev/pool"] == "decode"]
    assert [(p["status"]["phase"], p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            for p in decode] == [("Running", "2")]


def test_nodes_registered_through_the_api_are_the_fleet(emulator, k8s_deployment):
    """A test that seeds a cluster's nodes through the API (as kubelets register them) schedules against them."""
    emulator.resources["v1/nodes"] = {"kind": "Node", "namespaced": False, "subresources": ["status"]}
    target = KubernetesTarget(k8s_deployment.cluster)
    core = k8s.CoreV1Api(target.api)
    for node in [cpu_node("ip-10-0-9-9"), *_gpu_nodes(gpu_plugin=False)]:
        seeded = node.as_object()
        core.create_node({**seeded, "status": {}})
        core.patch_node_status(node.name, {"status": seeded["status"]})
    target.apply(k8s_deployment, target.desired(k8s_deployment)[0])
    assert f"prefill: Unschedulable: {NO_GPU}" in _why(target, k8s_deployment)
    assert sorted(n.metadata.name for n in core.list_node().items) == ["ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-9-9"]
    for name in ("ip-10-0-0-1", "ip-10-0-0-2"):  # the device plugin starts and reports the GPUs
        core.patch_node_status(name, {"status": {"allocatable": {"nvidia.com/gpu": "4"}}})
    _running(target, k8s_deployment)
