"""RayService, Namespace and Service manifests: valid against KubeRay's CRD and Kubernetes' schemas, pinned to
their pools, no secret values, and stable (golden files for a g6e and a p5 deployment)."""
import copy
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from deployments.catalog import RUNTIMES
from deployments.manifests import HASH_ANNOTATION, manifests_build, rayservice_image
from deployments.spec import spec_parse
from tests.factories import RUNTIME_IMAGE, spec_input
from tests.support.crd_validation import validate
from tests.support.structural_pruning import admit, crd_schema

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
K8S_VERSION = "1.31"
# What a cluster registers for the GPU runtime (its runtime_images setting): Tandem's runtime image, by digest.
IMAGE = RUNTIME_IMAGE


def _pool(itype, gpus, tp, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp}


SPECS = {
    "g6e": spec_input(prefill=_pool("g6e.xlarge", 1, 1), decode=_pool("g6e.xlarge", 1, 1, nodes=2)),
    "p5": spec_input(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("p5.48xlarge", 8, 4)),
}


def _render(key: str) -> list[dict]:
    spec = spec_parse(SPECS[key], target_kind="eks")
    return manifests_build(name="llama", namespace="tandem-ml-research", team_slug="ml-research", spec=spec,
                           target_kind="eks", image=IMAGE)


def _variant(variant: str) -> dict:
    """A RayService as Tandem renders it: the golden files' (a pool without EFA, one with), an EFA pool off eks (no
    hugepages), pools pinned by node group (the eks driver's selectors), and a rollout's application with fixed
    replicas."""
    if variant in SPECS:
        return _render(variant)[-1]
    spec = spec_parse(SPECS["p5"], target_kind="kubernetes" if variant == "efa-kubernetes" else "eks")
    extra = {"efa-kubernetes": {"target_kind": "kubernetes"},
             "node-groups": {"node_selectors": {s: {"eks.amazonaws.com/nodegroup": f"tandem-d7-{s}"}
                                                for s in ("prefill", "decode")}},
             "rollout": {"name": "llama-g3", "replicas": {"prefill": 1, "decode": 2},
                         "generation_of": "llama"}}[variant]
    return manifests_build(**{"name": "llama", "namespace": "tandem-ml-research", "team_slug": "ml-research",
                              "spec": spec, "target_kind": "eks", "image": IMAGE, **extra})[-1]


@pytest.mark.parametrize("version", ["1.5.1", "1.6.2"])
@pytest.mark.parametrize("variant", [*SPECS, "efa-kubernetes", "node-groups", "rollout"])
def test_every_rayservice_tandem_renders_is_whole_and_valid_on_the_kuberay_it_requires(variant, version):
    """As the API server admits it: nothing pruned, and nothing its CRD's schema refuses."""
    rs = copy.deepcopy(_variant(variant))
    schema = crd_schema(version)
    assert admit(rs, schema) == []
    assert [str(e) for e in validate(rs, schema)] == []


def test_the_crd_check_catches_a_broken_manifest():
    rs = _render("g6e")[-1]
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    replicas = "spec.rayClusterConfig.workerGroupSpecs[0].replicas"
    assert str(validate(rs, crd_schema("1.6.2"))[0]) == \
        f'{replicas}: Invalid value: "string": {replicas} in body must be of type integer: "string"'


@pytest.mark.parametrize("key", SPECS)
def test_core_objects_and_pod_templates_are_valid_kubernetes(key):
    ns, sa, svc, rs = _render(key)
    for obj in (ns, sa, svc):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    cluster = rs["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **group["template"]["metadata"]},
               "spec": group["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def _worker(rs, stage):
    return next(g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == stage)


def test_p5_workers_get_efa_devices_hugepages_and_libfabric():
    rs = _render("p5")[-1]
    prefill = _worker(rs, "prefill")
    limits = prefill["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "32"
    assert limits["hugepages-2Mi"] == "5120Mi"  # what the eks target's EFA node groups reserve
    assert {"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"} in \
        prefill["template"]["spec"]["tolerations"]
    assert prefill["resources"] == {"prefill_pool": "8"}
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    kv = serve["applications"][0]["args"]["decode_config"]["engine_kwargs"]["kv_transfer_config"]
    assert kv["kv_connector_extra_config"] == {"backends": ["LIBFABRIC"]}
    container = prefill["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_HUGE_PAGE" not in env  # the eks node groups reserve the hugepages asked for


@pytest.mark.parametrize("key", SPECS)
@pytest.mark.parametrize("target_kind", ["eks", "kubernetes"])
def test_the_head_and_both_pools_run_the_one_image_given_and_no_pod_sets_ld_library_path(key, target_kind):
    """The image owns LD_LIBRARY_PATH (libfabric first, before its own entries: deploy/runtime/Dockerfile); a
    pod's value would replace the image's, dropping Amazon Linux's /opt/amazon/efa/lib64 or whatever the base sets."""
    spec = spec_parse(SPECS[key], target_kind=target_kind)
    rs = manifests_build(name="llama", namespace="tandem-ml-research", team_slug="ml-research", spec=spec,
                         target_kind=target_kind, image=IMAGE)[-1]
    cluster = rs["spec"]["rayClusterConfig"]
    containers = [g["template"]["spec"]["containers"][0] for g in [cluster["headGroupSpec"],
                                                                   *cluster["workerGroupSpecs"]]]
    assert [c["image"] for c in containers] == [IMAGE] * 3 and rayservice_image(rs) == IMAGE
    assert [e for c in containers for e in c.get("env", []) if e["name"] == "LD_LIBRARY_PATH"] == []


def test_an_efa_pool_outside_eks_asks_for_no_hugepages_and_tells_libfabric_not_to_use_them():
    spec = spec_parse(SPECS["p5"], target_kind="kubernetes")
    rs = manifests_build(name="llama", namespace="tandem-ml-research", team_slug="ml-research", spec=spec,
                         target_kind="kubernetes", image=IMAGE)[-1]
    container = _worker(rs, "decode")["template"]["spec"]["containers"][0]
    assert "hugepages-2Mi" not in container["resources"]["limits"]
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert {"name": "FI_EFA_USE_HUGE_PAGE", "value": "0"} in container["env"]


def test_the_upgrade_strategy_is_none_and_the_ray_cluster_part_has_its_own_hash():
    before = _render("g6e")[-1]
    assert before["spec"]["upgradeStrategy"] == {"type": "None"}
    SPECS["more"] = {**SPECS["g6e"], "decode": _pool("g6e.xlarge", 1, 1, nodes=3)}
    SPECS["serve"] = {**SPECS["g6e"], "engine": {"max_model_len": 4096}}
    try:
        more, serve = _render("more")[-1], _render("serve")[-1]
    finally:
        del SPECS["more"], SPECS["serve"]
    key = "tandem.dev/ray-cluster-hash"
    assert more["metadata"]["annotations"][key] != before["metadata"]["annotations"][key]
    assert serve["metadata"]["annotations"][key] == before["metadata"]["annotations"][key]


def test_ray_pods_run_as_the_team_service_account_annotated_with_its_role_only_when_given():
    spec = spec_parse(SPECS["g6e"], target_kind="eks")
    role = "arn:aws:iam::123456789012:role/tandem-ml-research"
    _, sa, _, rs = manifests_build(name="llama", namespace="tandem-ml-research", team_slug="ml-research", spec=spec,
                                   target_kind="eks", image=IMAGE, role_arn=role)
    assert (sa["kind"], sa["metadata"]["name"], sa["metadata"]["namespace"]) == \
        ("ServiceAccount", "tandem-ray", "tandem-ml-research")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role
    cluster = rs["spec"]["rayClusterConfig"]
    assert {g["template"]["spec"]["serviceAccountName"] for g in [cluster["headGroupSpec"],
                                                                 *cluster["workerGroupSpecs"]]} == {"tandem-ray"}
    plain = _render("g6e")[1]
    assert "eks.amazonaws.com/role-arn" not in plain["metadata"]["annotations"]


def test_every_gpu_runtime_states_its_versions_images_and_minimum_kuberay():
    for runtime in (r for r in RUNTIMES.values() if r.accelerator == "gpu"):
        assert all((runtime.ray, runtime.vllm, runtime.nixl, runtime.python, runtime.cuda, runtime.kuberay_min,
                    runtime.base_image, runtime.image_repository, runtime.efa_installer,
                    runtime.libfabric)), runtime.key
        # Ray's Ray LLM images are tagged <ray>-py<python>-cu<cuda> (ray-project/ray docker/ray-llm).
        tag = f"{runtime.ray}-py{runtime.python.replace('.', '')}-cu{runtime.cuda.replace('.', '')}"
        assert runtime.base_image == f"rayproject/ray-llm:{tag}", runtime.base_image


def test_g6e_workers_have_no_efa_and_the_head_has_no_gpu():
    rs = _render("g6e")[-1]
    decode = _worker(rs, "decode")
    assert decode["replicas"] == 2
    limits = decode["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert "vpc.amazonaws.com/efa" not in limits and "hugepages-2Mi" not in limits
    assert decode["template"]["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "g6e.xlarge"}
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert "nvidia.com/gpu" not in str(head["template"]["spec"]["containers"][0]["resources"])
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert {8265, 8080, 8000} <= ports


def test_ray_version_matches_the_runtime_image_and_the_secret_is_only_referenced():
    rs = _render("g6e")[-1]
    runtime = RUNTIMES[spec_parse(SPECS["g6e"], target_kind="eks").runtime]
    assert rs["spec"]["rayClusterConfig"]["rayVersion"] == runtime.ray
    assert runtime.base_image.split(":")[1].startswith(f"{runtime.ray}-")
    env = _worker(rs, "prefill")["template"]["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == "HF_TOKEN")
    assert "value" not in token and token["valueFrom"]["secretKeyRef"]["name"] == "tandem-model-access"


def test_spec_hash_annotations_move_only_for_the_objects_that_changed():
    before = _render("g6e")
    SPECS["changed"] = {**SPECS["g6e"], "engine": {"max_model_len": 4096}}
    try:
        after = _render("changed")
    finally:
        del SPECS["changed"]
    hashes = [[o["metadata"]["annotations"][HASH_ANNOTATION] for o in objs] for objs in (before, after)]
    assert hashes[0][:3] == hashes[1][:3] and hashes[0][3] != hashes[1][3]


@pytest.mark.parametrize("key", SPECS)
def test_rendering_matches_the_golden_file(key):
    path = GOLDEN / f"manifests-{key}.yaml"
    rendered = yaml.safe_dump_all(_render(key), sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN") == "1":  # the only way a golden file is written: by hand, on purpose
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered)
    assert path.exists(), f"{path} is missing: create it with UPDATE_GOLDEN=1 and review it before committing"
    assert rendered == path.read_text(), f"regenerate with UPDATE_GOLDEN=1 if the change to {path.name} is intended"
