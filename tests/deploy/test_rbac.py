"""The workers' RBAC against what the `kubernetes` driver really does.

The real driver runs a deployment through create, a no-op repeat, an update, observe and teardown against the API
emulator, authenticated the way the `kubernetes` overlay sets it up (the in-cluster kubeconfig with the service
account's token file). Every request it sent is turned into (verb, API group, resource) as the API server's
authorizer would see it, with the `bind` a RoleBinding's creation asks for on the ClusterRole it names. What it
did inside a team namespace after binding itself there is compared with the rendered tandem-team-namespace role,
everything else with the cluster-wide tandem-driver role, both ways: everything the driver does is allowed, and
neither role allows anything the driver does not do.
"""
import re

import pytest
import yaml

from deployments.manifests import namespace_guards_build
from deployments.models import Cluster
from tests.conftest import EMULATOR_TOKEN
from tests.deploy.render import find, render
from tests.factories import RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, TeamFactory
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


def granted(role: dict) -> set[tuple[str, str, str, str | None]]:
    """(verb, apiGroup, resource, resourceName: None for any) of every rule."""
    return {(verb, group, resource, name) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"] for name in rule.get("resourceNames", [None])}


def namespace_of(path: str) -> str | None:
    m = RESOURCE_PATH.match(path)
    return m["ns"] if m else None


def used_by_role(hits: list[tuple[str, str]], role_refs: dict[str, str]):
    """What the driver asked for, split by the role that must allow it: inside a namespace where it had bound
    itself (`role_refs`: namespace -> the ClusterRole its RoleBinding there names), the bound role; everything
    else, the first RoleBinding in such a namespace included (and the `bind` on its role), the cluster-wide role.
    The driver's look for its RoleBinding before it made one is refused (tests/workers/test_kubernetes_target.py
    answers it 403 as a real API server does), and asks for no right."""
    cluster_wide, team, bound = set(), set(), set()
    for method, path in hits:
        if (attrs := authorizer_attributes(method, path)) is None:
            continue
        ns = namespace_of(path)
        if attrs == ("create", "rbac.authorization.k8s.io", "rolebindings") and ns not in bound:
            cluster_wide |= {(*attrs, None), ("bind", "rbac.authorization.k8s.io", "clusterroles", role_refs[ns])}
            bound.add(ns)
        elif ns in bound:
            team.add((*attrs, None))
        elif attrs == ("get", "rbac.authorization.k8s.io", "rolebindings"):
            continue  # before it binds itself the API server answers 403, which the driver reads as "not there yet"
        else:
            cluster_wide.add((*attrs, None))
        if method == "DELETE" and attrs[2] == "namespaces":
            bound.discard(path.rsplit("/", 1)[1])  # its RoleBinding goes with it
    return cluster_wide, team


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
                             config={"namespace_prefix": "tandem-", "runtime_images": RUNTIME_IMAGES})
    deployment = DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster, name="llama")
    target = KubernetesTarget(cluster)

    assert target.observe(deployment).exists is False
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    target.apply(deployment, objects)  # a repeat changes nothing
    deployment.spec["engine"]["max_model_len"] = 4096
    target.apply(deployment, target.desired(deployment)[0])
    role_refs = {ns: o.raw["roleRef"]["name"] for (res, ns, _), o in emulator.objects.items()
                 if res.plural == "rolebindings"}
    # the Service, the RoleBinding and a NetworkPolicy drift (edited by someone): the driver puts them back; a
    # namespace is never rewritten
    emulator.namespaces["tandem-ml-research"]["metadata"]["annotations"] = {"tandem.dev/spec-hash": "old"}
    for plural in ("services", "rolebindings", "networkpolicies"):
        drifted = next(o for (res, _, _), o in emulator.objects.items() if res.plural == plural)
        drifted.patch({"metadata": {"annotations": {"tandem.dev/spec-hash": "old"}}})
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
    # the conformance run's read of the engines' logs (the prefill group's worker pod says which NIXL backend)
    prefill = next(p["metadata"]["name"] for p in emulator.pods("tandem-ml-research")
                   if p["metadata"]["labels"].get("tandem.dev/pool") == "prefill")
    emulator.pod_logs[("tandem-ml-research", prefill)] = "Backend LIBFABRIC was instantiated\n"
    assert target.engine_logs(deployment) == {"prefill": "Backend LIBFABRIC was instantiated\n", "decode": ""}
    wait_for(lambda: target.teardown(deployment).ready, timeout=5, what="teardown")
    assert emulator.live_objects() == []
    # then the preflight, on the cluster with its add-ons installed (seeded as its administrator, not counted)
    driver_hits = list(emulator.hits)
    cluster_addons.install_kinds(emulator)
    cluster_addons.cluster_ready(cluster_addons.emulator_client(emulator, token=EMULATOR_TOKEN))
    TeamFactory(slug="other")
    mark = len(emulator.hits)
    assert [line.name for line in Preflight(target).run() if line.status != "pass"] == []
    emulator.hits[:] = driver_hits + emulator.hits[mark:]
    assert set(emulator.authorizations) == {f"Bearer {EMULATOR_TOKEN}"}  # all of it as the service account

    cluster_wide, team = used_by_role(emulator.hits, role_refs)
    assert set(role_refs.values()) == {"tandem-team-namespace"}
    for role_name, used in (("tandem-driver", cluster_wide), ("tandem-team-namespace", team)):
        role = granted(find(render("kubernetes"), "ClusterRole", role_name))
        assert used - role == set(), f"the driver needs rights {role_name} does not grant"
        assert role - used == set(), f"{role_name} grants rights the driver never uses"
        assert role == granted(find(render("eks"), "ClusterRole", role_name))


def test_the_team_namespace_binding_names_the_identities_the_cluster_role_binds():
    """The RoleBinding the driver makes in a team namespace binds the same worker identities as the cluster-wide
    binding: its service account, and on EKS the group the access entry maps its IAM role to. Anyone else bound
    there would get the worker's rights in every team namespace."""
    binding = namespace_guards_build(namespace="tandem-t", team_slug="t", kuberay_namespace_labels={"a": "b"},
                                     prometheus_namespace_labels={})[0]
    assert binding["kind"] == "RoleBinding" and binding["roleRef"]["name"] == "tandem-team-namespace"
    eks = find(render("eks"), "ClusterRoleBinding", "tandem-driver")["subjects"]
    assert sorted(binding["subjects"], key=str) == sorted(eks, key=str)
    assert find(render("kubernetes"), "ClusterRoleBinding", "tandem-driver")["subjects"] == \
        [s for s in binding["subjects"] if s["kind"] == "ServiceAccount"]
