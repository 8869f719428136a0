"""The workers' RBAC against what the `kubernetes` driver really does.

The real driver runs a deployment through create, a no-op repeat, an update, observe and teardown against the API
emulator, authenticated the way the `kubernetes` overlay sets it up (the in-cluster kubeconfig with the service
account's token file). Every request it sent is turned into (verb, API group, resource) as the API server's
authorizer would see it, and compared with the rendered ClusterRole both ways: everything the driver does is
allowed, and the role allows nothing the driver does not do.
"""
import re

import pytest
import yaml
from kubernetes import client as k8s

from deployments.models import Cluster
from tests.conftest import EMULATOR_TOKEN
from tests.deploy.render import find, render
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory
from tests.support import cluster_addons
from tests.support.processes import wait_for
from workers.preflight import Preflight
from workers.targets.kubernetes import KubernetesTarget

RESOURCE_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                           r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)"
                           r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def authorizer_attributes(method: str, path: str) -> tuple[str, str, str] | None:
    """(verb, apiGroup, resource) as Kubernetes authorizes a request; None for discovery (no rule needed)."""
    if path in ("/api", "/apis") or re.fullmatch(r"/apis/[^/]+(/[^/]+)?", path):
        return None
    if re.fullmatch(r"/api/v1/namespaces/?", path) or re.fullmatch(r"/api/v1/namespaces/[^/]+", path):
        name = path.rstrip("/").rsplit("/", 1)[1] if path.rstrip("/") != "/api/v1/namespaces" else None
        verb = VERBS.get(method) or ("get" if name else "list")
        return verb, "", "namespaces"
    m = RESOURCE_PATH.match(path)
    assert m, f"the driver sent a request the test cannot read: {method} {path}"
    group = "" if m["core"] else m["group"]
    verb = VERBS.get(method) or ("get" if m["name"] else "list")
    resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
    return verb, group, resource


def granted(role: dict) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture
def in_cluster_kubeconfig(emulator, tmp_path):
    """The kubernetes overlay's kubeconfig, pointed at the emulator, with a service-account token file."""
    text = find(render("kubernetes"), "ConfigMap", "tandem-in-cluster-kubeconfig")["data"]["in-cluster.yaml"]
    config = yaml.safe_load(text)
    token = tmp_path / "token"
    token.write_text(EMULATOR_TOKEN)
    config["clusters"][0]["cluster"] = {"server": emulator.base_url}
    assert config["users"][0]["user"] == {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    config["users"][0]["user"]["tokenFile"] = str(token)
    path = tmp_path / "in-cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return f"file:{path}"


@pytest.mark.django_db
def test_the_driver_role_allows_exactly_what_the_driver_does(emulator, in_cluster_kubeconfig, monkeypatch):
    cluster = ClusterFactory(kind=Cluster.Kind.KUBERNETES, secret_ref=in_cluster_kubeconfig,
                             config={"namespace_prefix": "tandem-"})
    deployment = DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster, name="llama")
    target = KubernetesTarget(cluster)

    assert target.observe(deployment).exists is False
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    target.apply(deployment, objects)  # a repeat changes nothing
    deployment.spec["engine"]["max_model_len"] = 4096
    target.apply(deployment, target.desired(deployment)[0])
    # the namespace and Service drift (labels edited by someone): the driver puts them back
    emulator.namespaces["tandem-ml-research"]["metadata"]["annotations"] = {"tandem.dev/spec-hash": "old"}
    svc = next(o for (res, _, _), o in emulator.objects.items() if res.plural == "services")
    svc.patch({"metadata": {"annotations": {"tandem.dev/spec-hash": "old"}}})
    target.apply(deployment, target.desired(deployment)[0])
    # the team gets an IAM role for its Ray pods: the driver annotates the team's service account
    cluster.config["team_roles"] = {"ml-research": "arn:aws:iam::123456789012:role/tandem-ml-research"}
    target.apply(deployment, target.desired(deployment)[0])
    # and a Hugging Face token, copied into its namespace (created, then replaced on the next apply)
    monkeypatch.setenv("TANDEM_CLUSTER_HF_ML_RESEARCH", "hf_not_a_real_token")
    cluster.config["hf_token_refs"] = {"ml-research": "env:TANDEM_CLUSTER_HF_ML_RESEARCH"}
    target.apply(deployment, target.desired(deployment)[0])
    target.apply(deployment, target.desired(deployment)[0])
    wait_for(lambda: target.observe(deployment).serve_status == "RUNNING", timeout=5, what="RUNNING")
    wait_for(lambda: target.teardown(deployment).ready, timeout=5, what="teardown")
    assert emulator.live_objects() == []
    # then the preflight, on the cluster with its add-ons installed (seeded as its administrator, not counted)
    driver_hits = list(emulator.hits)
    cluster_addons.install_kinds(emulator)
    cluster_addons.cluster_ready(cluster_addons.emulator_client(emulator, token=EMULATOR_TOKEN))
    TeamFactory(slug="other")
    mark = len(emulator.hits)
    assert [line.name for line in Preflight(target).run() if line.status != "pass"] == []
    # and the conformance run's read of the engines' logs (a worker pod of the deployment's prefill group)
    emulator.resources["v1/pods"] = {"kind": "Pod", "namespaced": True, "subresources": ["log"]}
    seed, preflight_hits = cluster_addons.emulator_client(emulator, token=EMULATOR_TOKEN), emulator.hits[mark:]
    k8s.CoreV1Api(seed).create_namespaced_pod("tandem-ml-research", {"metadata": {
        "name": "llama-prefill-worker-0", "labels": {"tandem.dev/deployment": "llama", "tandem.dev/pool": "prefill"}},
        "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray-llm"}]}})
    emulator.pod_logs[("tandem-ml-research", "llama-prefill-worker-0")] = "Backend LIBFABRIC was instantiated\n"
    mark_logs = len(emulator.hits)
    assert target.engine_logs(deployment) == {"prefill": "Backend LIBFABRIC was instantiated\n", "decode": ""}
    emulator.hits[:] = driver_hits + preflight_hits + emulator.hits[mark_logs:]
    assert set(emulator.authorizations) == {f"Bearer {EMULATOR_TOKEN}"}  # all of it as the service account

    used = {a for a in (authorizer_attributes(m, p) for m, p in emulator.hits) if a is not None}
    role = granted(find(render("kubernetes"), "ClusterRole", "tandem-driver"))
    assert used - role == set(), "the driver needs rights the role does not grant"
    assert role - used == set(), "the role grants rights the driver never uses"
    assert role == granted(find(render("eks"), "ClusterRole", "tandem-driver"))
