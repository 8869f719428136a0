"""deploy/: both overlays render, validate against the Kubernetes schemas, apply to the API emulator with the
official client, and keep the promises docs/install.md makes (replicas, probes, limits, security, secrets)."""
import json

import httpx
import kubernetes_validate
import pytest
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.deploy.render import OVERLAYS, WORKLOADS, api_path, find, pod_spec, render
from tests.support.k8s_emulator import EmulatorThread, KubeRayEmulator

# The oldest and newest Kubernetes minor versions EKS offers standard support for when this was written.
K8S_VERSIONS = ["1.31", "1.34"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_validates_against_the_kubernetes_schema(overlay, version):
    objects = render(overlay)
    assert len(objects) > 20
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_applies_to_the_api_emulator(overlay):
    objects = render(overlay)
    emulator = KubeRayEmulator()
    emulator.install_control_plane_kinds()
    with EmulatorThread(emulator):
        configuration = k8s.Configuration()
        configuration.host = emulator.base_url
        with k8s.ApiClient(configuration) as api:
            for obj in objects:  # in kustomize's order: the Namespace first, as a real server needs
                k8s_utils.create_from_dict(api, obj)
        for obj in objects:
            stored = httpx.get(emulator.base_url + api_path(obj)).json()
            assert {k: v for k, v in stored.items() if k != "metadata"} == \
                {k: v for k, v in obj.items() if k != "metadata"}, api_path(obj)
            assert stored["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tandem"
        assert len(emulator.live_objects()) == len(objects)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_strategies_and_the_autoscaler(overlay):
    objects = render(overlay)
    for name in ("tandem-web", "tandem-gateway", "tandem-worker"):
        deployment = find(objects, "Deployment", name)
        autoscaled = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"
                      and o["spec"]["scaleTargetRef"]["name"] == name]
        # What an autoscaler scales states no count of its own, which every `kubectl apply` would put back.
        assert ("replicas" not in deployment["spec"]) if autoscaled else deployment["spec"]["replicas"] >= 2
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert find(objects, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"] == \
            deployment["spec"]["selector"]["matchLabels"]
    beat = find(objects, "Deployment", "tandem-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert not [o for o in objects if o["kind"] in ("PodDisruptionBudget", "HorizontalPodAutoscaler")
                and "beat" in o["metadata"]["name"]]
    hpa = find(objects, "HorizontalPodAutoscaler", "tandem-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "tandem-gateway" and hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert find(objects, "Service", "tandem-gateway")["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_non_root_read_only_limited_and_waits_for_migrations(overlay):
    objects = render(overlay)
    for obj in (o for o in objects if o["kind"] in WORKLOADS):
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == "tmp")
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (obj["metadata"]["name"], c["name"])
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
            assert set(c["resources"]) == {"requests", "limits"}
            assert {"memory", "cpu"} <= set(c["resources"]["limits"])
            assert {"configMapRef": {"name": "tandem-settings"}} in c["envFrom"]
            assert {"secretRef": {"name": "tandem-secrets"}} in c["envFrom"]
        if obj["kind"] == "Deployment":
            wait = spec["initContainers"][0]
            assert "manage.py migrate --check" in " ".join(wait["command"])
    migrate = find(objects, "Job", "tandem-migrate")
    assert pod_spec(migrate)["containers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_web_and_gateway_probe_healthz_and_readyz_and_drain_before_they_stop(overlay):
    objects = render(overlay)
    for name, limit in (("tandem-web", 25), ("tandem-gateway", 30)):
        spec = pod_spec(find(objects, "Deployment", name))
        container = spec["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
        assert spec["terminationGracePeriodSeconds"] > pause + limit
    settings = find(objects, "ConfigMap", "tandem-settings")["data"]
    assert settings["TANDEM_GATEWAY_DRAIN_SECONDS"] == "30"
    assert "--graceful-timeout" in pod_spec(find(objects, "Deployment", "tandem-web"))["containers"][0]["command"]


# Settings that hold secrets (the URLs carry passwords): they come only from the tandem-secrets Secret.
SECRET_SETTINGS = {"DJANGO_SECRET_KEY", "TANDEM_KEY_HMAC_SECRET", "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL",
                   "TANDEM_OIDC_CLIENT_SECRET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_value_is_in_the_manifests(overlay):
    objects = render(overlay)
    assert not [o for o in objects if o["kind"] == "Secret"]
    for cm in (o for o in objects if o["kind"] == "ConfigMap"):
        assert not set(cm["data"]) & SECRET_SETTINGS, cm["metadata"]["name"]
    for obj in (o for o in objects if o["kind"] in WORKLOADS):
        for c in pod_spec(obj).get("initContainers", []) + pod_spec(obj)["containers"]:
            assert not [e for e in c.get("env", []) if "value" in e]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_deny_by_default_and_only_tandem_pods_reach_postgres_and_redis(overlay):
    objects = render(overlay)
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for name, spec in policies.items():
        for rule in spec.get("egress", []):
            assert rule.get("ports"), f"{name} allows egress on every port"
            ports = {p["port"] for p in rule["ports"]}
            if ports & {5432, 6379}:
                assert name == "datastores" and spec["podSelector"] == \
                    {"matchLabels": {"tandem.dev/datastore-client": "true"}}
    gateway = policies["gateway"]["egress"][0]
    assert gateway["to"][0]["namespaceSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "tandem"}}
    assert gateway["ports"] == [{"protocol": "TCP", "port": 8000}]
    reaches_apis = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"
                    and o["spec"]["template"]["metadata"]["labels"].get("tandem.dev/reaches-apis") == "true"}
    assert reaches_apis == {"tandem-web", "tandem-worker"}
    datastore_clients = {o["metadata"]["name"] for o in objects if o["kind"] in WORKLOADS
                         and o["spec"]["template"]["metadata"]["labels"].get("tandem.dev/datastore-client")}
    assert datastore_clients == {"tandem-web", "tandem-gateway", "tandem-worker", "tandem-beat", "tandem-migrate"}


def test_eks_uses_irsa_and_maps_the_role_to_the_driver_group():
    objects = render("eks")
    sa = find(objects, "ServiceAccount", "tandem-worker")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert find(objects, "Deployment", "tandem-worker")["spec"]["template"]["spec"]["serviceAccountName"] == \
        "tandem-worker"
    subjects = find(objects, "ClusterRoleBinding", "tandem-driver")["subjects"]
    assert {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "tandem-driver"} in subjects
    assert "AWS_ACCESS_KEY_ID" not in json.dumps(objects) and "AWS_SECRET_ACCESS_KEY" not in json.dumps(objects)
    for name in ("tandem-web", "tandem-gateway"):  # only workers hold a Kubernetes token
        sa = find(objects, "ServiceAccount", name)
        assert sa["automountServiceAccountToken"] is False
