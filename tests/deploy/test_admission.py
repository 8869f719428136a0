"""The ValidatingAdmissionPolicy deploy/ renders, evaluated as the API server evaluates it: its CEL with
cel-python (standard CEL: the policy uses none of Kubernetes' CEL extensions), over the variables an admission
request binds (`request`, `object`, `oldObject`, `namespaceObject`, `variables`), after its matchConstraints and
matchConditions; a validation that is false, or that fails to evaluate (failurePolicy Fail), refuses the request.
Tandem's own manifests (the golden files) are admitted; what a worker with stolen credentials would try is not."""
import copy
from pathlib import Path

import celpy
import pytest
import yaml

from deployments.manifests import namespace_guards_build
from tests.deploy.render import OVERLAYS, find, render

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
WORKER = {"username": "system:serviceaccount:tandem:tandem-worker",
          "groups": ["system:serviceaccounts", "system:serviceaccounts:tandem", "system:authenticated"]}
EKS_WORKER = {"username": "arn:aws:sts::111122223333:assumed-role/tandem-worker/botocore-session-1",
              "groups": ["tandem-driver", "system:authenticated"]}
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
RESOURCES = {"RayService": ("ray.io", "v1", "rayservices"), "Namespace": ("", "v1", "namespaces"),
             "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings")}
CEL = celpy.Environment()


def evaluate(expression: str, activation: dict):
    return CEL.program(CEL.compile(expression)).evaluate(activation)


def admission(policy: dict, *, operation: str, obj: dict | None, old: dict | None = None,
              namespace: dict | None = None, user: dict = WORKER) -> list[str]:
    """The messages the policy refuses the request with; [] when admitted (or when the policy does not match)."""
    kind = (obj or old)["kind"]
    group, version, resource = RESOURCES[kind]
    spec = policy["spec"]
    if not any(group in r["apiGroups"] and resource in r["resources"] and operation in r["operations"]
               for r in spec["matchConstraints"]["resourceRules"]):
        return []
    request = {"operation": operation, "userInfo": user, "kind": {"group": group, "version": version, "kind": kind},
               "resource": {"group": group, "version": version, "resource": resource},
               "name": (obj or old)["metadata"]["name"], "namespace": (obj or old)["metadata"].get("namespace", "")}
    activation = {"request": request, "object": obj, "oldObject": old, "namespaceObject": namespace}
    activation = {k: celpy.json_to_cel(v) for k, v in activation.items()}
    if not all(evaluate(c["expression"], activation) for c in spec.get("matchConditions", [])):
        return []
    variables = celpy.celtypes.MapType()
    for variable in spec.get("variables", []):  # an error is kept: the API server meets it only where it is used
        try:
            value = evaluate(variable["expression"], {**activation, "variables": variables})
        except celpy.CELEvalError as e:
            value = e
        variables[celpy.celtypes.StringType(variable["name"])] = value
    activation["variables"] = variables
    refused = []
    for validation in spec["validations"]:
        try:
            ok = evaluate(validation["expression"], activation)
        except celpy.CELEvalError as e:  # failurePolicy: Fail
            ok, validation = False, {"message": f"{validation['expression']} failed: {e}"}
        if not isinstance(ok, celpy.celtypes.BoolType) or not ok:
            refused.append(validation["message"])
    return refused


@pytest.fixture(scope="module", params=OVERLAYS)
def policy(request) -> dict:
    objects = render(request.param)
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "tandem-driver-limits")
    assert binding["spec"]["validationActions"] == ["Deny"]
    vap = find(objects, "ValidatingAdmissionPolicy", binding["spec"]["policyName"])
    assert vap["spec"]["failurePolicy"] == "Fail"
    return vap


def golden(name: str) -> tuple[dict, dict]:
    """(Namespace, RayService) of a golden manifest set, as Tandem writes them."""
    objects = list(yaml.safe_load_all((GOLDEN / name).read_text()))
    return find(objects, "Namespace", objects[0]["metadata"]["name"]), \
        next(o for o in objects if o["kind"] == "RayService")


KUBE_SYSTEM = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "kube-system", "labels": {"kubernetes.io/metadata.name": "kube-system"}}}


@pytest.mark.parametrize("name", ["manifests-g6e.yaml", "manifests-p5.yaml"])
def test_tandems_own_objects_are_admitted(policy, name):
    ns, rs = golden(name)
    for user in (WORKER, EKS_WORKER):
        assert admission(policy, operation="CREATE", obj=rs, namespace=ns, user=user) == []
        assert admission(policy, operation="UPDATE", obj=rs, old=rs, namespace=ns, user=user) == []
    for obj in namespace_guards_build(namespace=ns["metadata"]["name"], team_slug="ml-research",
                                      kuberay_namespace_labels={}, prometheus_namespace_labels={}):
        if obj["kind"] == "RoleBinding":
            assert admission(policy, operation="CREATE", obj=obj, namespace=ns) == []
    assert admission(policy, operation="DELETE", obj=None, old=ns) == []


def _in(rs: dict, namespace: str) -> dict:
    moved = copy.deepcopy(rs)
    moved["metadata"]["namespace"] = namespace
    return moved


def test_a_rayservice_or_a_rolebinding_outside_tandems_namespaces_is_refused(policy):
    ns, rs = golden("manifests-p5.yaml")
    for user in (WORKER, EKS_WORKER):
        assert admission(policy, operation="CREATE", obj=_in(rs, "kube-system"), namespace=KUBE_SYSTEM,
                         user=user) == ["Tandem's worker may create RayServices only in namespaces labelled "
                                        "app.kubernetes.io/managed-by=tandem."]
    # a namespace someone else labelled for a team, without Tandem's managed-by label, is not Tandem's either
    lookalike = {**ns, "metadata": {"name": "tandem-x", "labels": {"tandem.dev/team": "ml-research"}}}
    assert admission(policy, operation="UPDATE", obj=_in(rs, "tandem-x"), old=_in(rs, "tandem-x"),
                     namespace=lookalike) != []
    binding = namespace_guards_build(namespace="kube-system", team_slug="ml-research", kuberay_namespace_labels={},
                                     prometheus_namespace_labels={})[0]
    assert admission(policy, operation="CREATE", obj=binding, namespace=KUBE_SYSTEM) == [
        "Tandem's worker may bind roles only in namespaces labelled app.kubernetes.io/managed-by=tandem."]
    assert admission(policy, operation="DELETE", obj=None, old=KUBE_SYSTEM) == [
        "Tandem's worker may delete only namespaces labelled app.kubernetes.io/managed-by=tandem."]


def test_in_a_team_namespace_the_worker_binds_its_role_to_itself_only(policy):
    ns, _ = golden("manifests-p5.yaml")
    binding = namespace_guards_build(namespace=ns["metadata"]["name"], team_slug="ml-research",
                                     kuberay_namespace_labels={}, prometheus_namespace_labels={})[0]
    to_the_ray_pods = copy.deepcopy(binding)
    to_the_ray_pods["subjects"].append({"kind": "ServiceAccount", "name": "tandem-ray",
                                        "namespace": ns["metadata"]["name"]})
    another_role = {**copy.deepcopy(binding), "roleRef": {**binding["roleRef"], "name": "tandem-driver"}}
    for changed in (to_the_ray_pods, another_role):
        assert admission(policy, operation="CREATE", obj=changed, namespace=ns) == [
            "Tandem's worker may bind only tandem-team-namespace, and only to itself."]


def _head(rs: dict) -> dict:
    return rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]


def _worker(rs: dict, i: int = -1) -> dict:
    return rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][i]["template"]["spec"]


def _host_path(rs):
    _worker(rs)["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    _worker(rs)["containers"][0]["volumeMounts"].append({"name": "root", "mountPath": "/host"})


def _privileged(rs):
    _head(rs)["containers"][0]["securityContext"] = {"privileged": True}


def _capability(rs):
    _worker(rs, 0)["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}


def _privileged_init(rs):
    _worker(rs)["initContainers"] = [{"name": "x", "image": "busybox", "securityContext": {"privileged": True}}]


def _host_network(rs):
    _worker(rs)["hostNetwork"] = True


def _host_pid(rs):
    _head(rs)["hostPID"] = True


def _another_service_account(rs):
    _head(rs)["serviceAccountName"] = "kuberay-operator"


def _no_service_account(rs):
    del _worker(rs, 0)["serviceAccountName"]


@pytest.mark.parametrize(("change", "message"), [
    (_host_path, "A RayService's pods may mount only emptyDir, configMap, secret and projected volumes (no hostPath)."),
    (_privileged, "A RayService's containers may not run privileged or add capabilities."),
    (_capability, "A RayService's containers may not run privileged or add capabilities."),
    (_privileged_init, "A RayService's containers may not run privileged or add capabilities."),
    (_host_network, "A RayService's pods may not use the node's network, PID or IPC namespace."),
    (_host_pid, "A RayService's pods may not use the node's network, PID or IPC namespace."),
    (_another_service_account, "A RayService's pods must run as the team's service account tandem-ray."),
    (_no_service_account, "A RayService's pods must run as the team's service account tandem-ray."),
])
def test_a_pod_template_outside_the_allow_list_is_refused_even_in_a_team_namespace(policy, change, message):
    ns, rs = golden("manifests-p5.yaml")  # EFA: the most a Tandem pod asks for
    changed = copy.deepcopy(rs)
    change(changed)
    for operation in ("CREATE", "UPDATE"):
        assert admission(policy, operation=operation, obj=changed, old=rs if operation == "UPDATE" else None,
                         namespace=ns, user=EKS_WORKER) == [message]


def test_nobody_elses_requests_are_matched(policy):
    _, rs = golden("manifests-p5.yaml")
    changed = _in(rs, "kube-system")
    _host_path(changed)
    assert admission(policy, operation="CREATE", obj=changed, namespace=KUBE_SYSTEM, user=ADMIN) == []
    assert admission(policy, operation="DELETE", obj=None, old=KUBE_SYSTEM, user=ADMIN) == []
