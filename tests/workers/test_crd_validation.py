"""RayServices validated by KubeRay's CRD as kube-apiserver validates them, and refused with its 422 and its words.

The emulated API server admits every RayService write (create, replace, patch) with the `openAPIV3Schema` of the
KubeRay release it runs (tests/support/kuberay_crds): pruned, defaulted, then validated (tests/support/
crd_validation.py). The expected messages are kube-apiserver's, as apimachinery's field errors print them and as
CRD authors' envtest suites record them (e.g. "Too many: 3: must have at most 2 items", "Unsupported value: ...:
supported values: ...", "... in body should be at least 1 chars long")."""
import copy
import json

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.support.crd_validation import invalid_status, validate
from tests.support.structural_pruning import admit, crd_schema
from tests.workers.conftest import TOKEN
from workers.targets.base import PermanentError
from workers.targets.kubernetes import GROUP, PLURAL, VERSION, KubernetesTarget

NS = "tandem-ml-research"
RS = f"/apis/ray.io/v1/namespaces/{NS}/rayservices"
REPLICAS = "spec.rayClusterConfig.workerGroupSpecs[0].replicas"
TYPE_ERROR = f'Invalid value: "string": {REPLICAS} in body must be of type integer: "string"'
# KubeRay's CRDs carry CEL rules (spec.rayClusterConfig.managedBy), which the API server leaves unchecked after a
# type error, and says so (apiextensions-apiserver strategy.go, hasBlockingErr).
NOT_CHECKED = ("some validation rules were not checked because the object was invalid; correct the existing errors to "
               "complete validation")
WRONG_TYPE = (f'RayService.ray.io "llama" is invalid: [{REPLICAS}: {TYPE_ERROR}, '
              f'<nil>: Invalid value: null: {NOT_CHECKED}]')


def _rendered(deployment) -> dict:
    return KubernetesTarget(deployment.cluster).desired(deployment)[0][-1]


def _errors(rs: dict, *, version: str = "1.6.2", old: dict | None = None) -> list[str]:
    """What the API server answers for `rs`, one line per field error."""
    schema = crd_schema(version)
    admitted = copy.deepcopy(rs)
    admit(admitted, schema)
    return [str(e) for e in validate(admitted, schema, old=old)]


def _client(emulator) -> k8s.CustomObjectsApi:
    configuration = k8s.Configuration()
    configuration.host = emulator.base_url
    configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
    return k8s.CustomObjectsApi(k8s.ApiClient(configuration))


# --- over HTTP, with the official client --------------------------------------------------------------------------
def test_a_rayservice_of_the_wrong_type_is_refused_with_the_api_servers_422(emulator, k8s_deployment):
    rs = _rendered(k8s_deployment)
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(ApiException) as refused:
        _client(emulator).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, rs)
    assert refused.value.status == 422
    assert json.loads(refused.value.body) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": WRONG_TYPE,
        "reason": "Invalid", "details": {"name": "llama", "group": "ray.io", "kind": "RayService", "causes": [
            {"reason": "FieldValueTypeInvalid", "field": REPLICAS, "message": TYPE_ERROR},
            {"reason": "FieldValueInvalid", "field": "<nil>", "message": f"Invalid value: null: {NOT_CHECKED}"}]},
        "code": 422}
    assert emulator.rayservices() == []  # nothing stored


def test_a_replace_or_a_patch_that_makes_the_rayservice_invalid_is_refused_and_changes_nothing(emulator,
                                                                                             k8s_deployment):
    rs = _rendered(k8s_deployment)
    api = _client(emulator)
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, rs)
    stored = api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")
    broken = copy.deepcopy(stored)
    broken["spec"]["rayClusterConfig"]["authOptions"]["mode"] = "password"
    with pytest.raises(ApiException) as replaced:
        api.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama", broken)
    assert (replaced.value.status, json.loads(replaced.value.body)["message"]) == (422, (
        'RayService.ray.io "llama" is invalid: [spec.rayClusterConfig.authOptions.mode: Unsupported value: '
        f'"password": supported values: "disabled", "token", <nil>: Invalid value: null: {NOT_CHECKED}]'))
    # A merge patch is validated as the object it makes: this one leaves a container without its name.
    containers = copy.deepcopy(stored["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"])
    del containers[0]["name"]
    with pytest.raises(ApiException) as patched:
        api.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama", {"spec": {"rayClusterConfig": {
            "headGroupSpec": {"template": {"spec": {"containers": containers}}}}}})
    assert json.loads(patched.value.body)["message"] == (
        'RayService.ray.io "llama" is invalid: ['
        f'spec.rayClusterConfig.headGroupSpec.template.spec.containers[0].name: Required value, <nil>: Invalid value: '
        f'null: {NOT_CHECKED}]')
    after = api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")
    assert (after["metadata"]["resourceVersion"], after["spec"]) == (stored["metadata"]["resourceVersion"],
                                                                     stored["spec"])


def test_a_valid_patch_is_stored_as_the_admitted_object_it_makes(emulator, k8s_deployment):
    """The API server prunes, defaults and validates what a patch makes, and stores that."""
    api = _client(emulator)
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _rendered(k8s_deployment))
    group = copy.deepcopy(api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")["spec"][
        "rayClusterConfig"]["workerGroupSpecs"][0])
    group["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "colour": "red"}]
    answer = httpx.patch(f"{emulator.base_url}{RS}/llama", headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/merge-patch+json"},
        json={"spec": {"rayClusterConfig": {"workerGroupSpecs": [group]}}})
    assert answer.status_code == 200, answer.text
    port = emulator.rayservices()[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"][0]["ports"]
    assert port == [{"containerPort": 8080, "protocol": "TCP"}]  # pruned, and defaulted as the CRD says
    assert answer.headers.get_list("warning") == [
        '299 - "unknown field \\"spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].ports[0].'
        'colour\\""']


def test_the_kubernetes_driver_fails_the_apply_with_the_api_servers_words(emulator, k8s_deployment):
    target = KubernetesTarget(k8s_deployment.cluster)
    objects, _ = target.desired(k8s_deployment)
    objects[-1]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(PermanentError) as caught:
        target.apply(k8s_deployment, objects)
    assert str(caught.value) == f"Kubernetes rejected the manifest while creating the RayService on k8s-emu: " \
                                f"{WRONG_TYPE}"
    assert emulator.rayservices() == []


# --- the rules, as the API server words each --------------------------------------------------------------------
@pytest.fixture
def rs(k8s_deployment) -> dict:
    return _rendered(k8s_deployment)


def _worker(rs: dict) -> dict:
    return rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]


def test_tandems_rayservice_is_valid_and_each_broken_field_is_named(rs):
    assert _errors(rs) == []
    container = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0]"
    broken = copy.deepcopy(rs)
    pod = _worker(broken)["template"]["spec"]
    pod["containers"][0]["resources"]["limits"]["memory"] = "lots"  # a pattern (Kubernetes quantities)
    pod["containers"].append({"name": "ray-worker", "image": "x"})  # listType map, keyed by name
    pod["containers"][0]["ports"] = [{"containerPort": 8000}, {"containerPort": 8000, "protocol": "TCP"}]
    del _worker(broken)["groupName"]  # required
    assert _errors(broken) == [
        "spec.rayClusterConfig.workerGroupSpecs[0].groupName: Required value",
        f"{container}.resources.limits.memory: Invalid value: \"lots\": {container}.resources.limits.memory in body "
        "should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+"
        "(\\.[0-9]*)?)|(\\.[0-9]+))))?$'",
        'spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[1]: Duplicate value: {"name":"ray-worker"}',
        f'{container}.ports[1]: Duplicate value: {{"containerPort":8000,"protocol":"TCP"}}',
        f"<nil>: Invalid value: null: {NOT_CHECKED}"]


def test_int_or_string_nullable_and_integral_numbers_as_the_api_server_takes_them(rs):
    limits = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu"
    broken = copy.deepcopy(rs)
    _worker(broken)["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = True
    assert _errors(broken)[:3] == [
        f'{limits}: Invalid value: "boolean": {limits} in body must be of type integer,string: "boolean"',
        f'<nil>: Invalid value: "": "{limits}" must validate at least one schema (anyOf)',
        f'{limits}: Invalid value: "boolean": {limits} in body must be of type integer: "boolean"']
    fine = copy.deepcopy(rs)
    _worker(fine)["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = 46  # int or string
    _worker(fine)["replicas"] = 2.0  # JSON's 2.0 is an integer to the API server
    _worker(fine)["template"]["spec"]["nodeName"] = None  # a null the schema does not allow is dropped
    assert _errors(fine) == []


def test_enums_and_cel_rules_and_a_transition_rule_only_on_update(rs):
    managed = "spec.rayClusterConfig.managedBy"
    broken = copy.deepcopy(rs)
    broken["spec"]["rayClusterConfig"]["managedBy"] = "someone"
    assert _errors(broken) == [
        f"{managed}: Invalid value: \"someone\": the managedBy field value must be either 'ray.io/kuberay-operator' "
        "or 'kueue.x-k8s.io/multikueue'"]
    kueue = copy.deepcopy(rs)
    kueue["spec"]["rayClusterConfig"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert _errors(kueue) == []  # a create: `self == oldSelf` has no old value to compare
    kuberay = copy.deepcopy(rs)
    kuberay["spec"]["rayClusterConfig"]["managedBy"] = "ray.io/kuberay-operator"
    assert _errors(kuberay, old=kueue) == [
        f'{managed}: Invalid value: "ray.io/kuberay-operator": the managedBy field is immutable']


def test_sizes_bounds_and_formats_in_the_api_servers_words():
    schema = {"type": "object", "properties": {"spec": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "maxLength": 5, "minLength": 2},
        "peers": {"type": "array", "maxItems": 2, "minItems": 1, "items": {"type": "string"}},
        "size": {"type": "integer", "minimum": 1, "maximum": 8},
        "since": {"type": "string", "format": "date-time"}}}}}
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
           "spec": {"name": "toolong", "peers": ["a", "b", "c"], "size": 0, "since": "yesterday"}}
    assert [str(e) for e in validate(obj, schema)] == [
        "spec.name: Too long: may not be more than 5 bytes",
        "spec.peers: Too many: 3: must have at most 2 items",
        "spec.since: Invalid value: \"yesterday\": spec.since in body must be of type date-time: \"yesterday\"",
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"]
    obj["spec"] = {"name": "a", "peers": [], "size": 9, "since": "2026-12-08T10:00:00Z"}
    assert [str(e) for e in validate(obj, schema)] == [
        "spec.name: Invalid value: \"a\": spec.name in body should be at least 2 chars long",
        "spec.peers: Invalid value: 0: spec.peers in body should have at least 1 items",
        "spec.size: Invalid value: 9: spec.size in body should be less than or equal to 8"]
    del obj["spec"]
    assert [str(e) for e in validate(obj, {**schema, "required": ["spec"]})] == ["spec: Required value"]


def test_several_errors_are_one_message_in_brackets_each_once():
    from tests.support.crd_validation import FieldError

    errors = [FieldError("FieldValueRequired", "spec.a", "Required value"),
              FieldError("FieldValueRequired", "spec.a", "Required value"),
              FieldError("FieldValueInvalid", "spec.b", 'Invalid value: "x": bad')]
    status = invalid_status(kind="RayService", group="ray.io", name="llama", errors=errors)
    assert status["message"] == 'RayService.ray.io "llama" is invalid: [spec.a: Required value, spec.b: Invalid ' \
                                'value: "x": bad]'
    assert len(status["details"]["causes"]) == 3
