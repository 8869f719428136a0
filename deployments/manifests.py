"""Kubernetes objects for a deployment, built as data: YAML bases from k8s_templates/ patched structurally.

Pure functions: a typed spec in, plain dicts out (Namespace, ServiceAccount, Service, RayService; and the team
namespace's RoleBinding and NetworkPolicies). User text only
ever lands in dict values, never in YAML source. Every object carries Tandem's labels and a spec-hash annotation, so
a driver re-applies only the objects whose content changed. Nothing secret is ever in them: the team's Hugging Face
token is copied into the namespace by the driver (workers.targets.kubernetes), and only referenced here.
"""
import copy
from functools import cache
from pathlib import Path

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.hashing import content_hash
from deployments.placement import worker_amounts, worker_group_resources
from deployments.serve_config import STAGES, serve_config_build
from deployments.spec import DeploymentSpec, PoolSpec
from deployments.surge import nodes_for_replicas
from deployments.yamlio import yaml_dump, yaml_load

TEMPLATES = Path(__file__).resolve().parents[1] / "k8s_templates"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tandem"}
HASH_ANNOTATION = "tandem.dev/spec-hash"
DEPLOYMENT_LABEL = "tandem.dev/deployment"
TEAM_LABEL = "tandem.dev/team"
POOL_LABEL = "tandem.dev/pool"
# On the objects of an application a side-by-side rollout brings up beside the deployment's first (a name with a
# generation suffix, deployments.serve_config.serve_app_name): the deployment it belongs to. The first application
# has none, so what it was created with stays as it was.
GENERATION_OF_LABEL = "tandem.dev/generation-of"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # the kubelet sets it on every node
# Where a model-access credential (HF_TOKEN for gated Hugging Face models) lives: a Secret in the team namespace that
# the driver copies from the team's secret reference (cluster setting `hf_token_refs`). Manifests only reference it;
# optional, so public models need none.
MODEL_SECRET = "tandem-model-access"
RAY_SERVICE_ACCOUNT = "tandem-ray"  # one per team namespace: what the team's Ray pods run as
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
RAY_CLUSTER_HASH_ANNOTATION = "tandem.dev/ray-cluster-hash"
EFA_HUGEPAGES = "5120Mi"  # what AWS's EFA device plugin guide reserves for libfabric


@cache
def _template(name: str) -> dict:
    return yaml_load((TEMPLATES / name).read_text())


def template(name: str) -> dict:
    """A fresh copy of a YAML base from k8s_templates/."""
    return copy.deepcopy(_template(name))


def namespace_name(*, prefix: str, team_slug: str) -> str:
    """One namespace per team on a cluster: `<prefix><team>`, cut to a DNS label."""
    return f"{prefix}{team_slug}"[:63].rstrip("-")


def _labels(*, team_slug: str, name: str, generation_of: str = "") -> dict:
    labels = {**MANAGED_BY, TEAM_LABEL: team_slug, DEPLOYMENT_LABEL: name}
    if generation_of:
        labels[GENERATION_OF_LABEL] = generation_of
    return labels


def _stamp(obj: dict) -> dict:
    """Set the spec-hash annotation to the hash of everything else in the object."""
    obj.setdefault("metadata", {}).setdefault("annotations", {}).pop(HASH_ANNOTATION, None)
    if not obj["metadata"]["annotations"]:
        del obj["metadata"]["annotations"]
    digest = content_hash(obj)
    obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return obj


def _secret_env() -> list[dict]:
    ref = {"name": MODEL_SECRET, "key": "HF_TOKEN", "optional": True}
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}}]


def _worker_group(*, stage: str, pool: PoolSpec, image: str, labels: dict, node_selector: dict, hugepages: bool,
                  nodes: int) -> dict:
    instance = INSTANCE_TYPES[pool.instance_type]
    group = template("worker_group.yaml")
    group.update(groupName=stage, replicas=nodes, minReplicas=nodes, maxReplicas=nodes)
    # The custom resource the stage's placement bundles consume: one unit per GPU of the node.
    group["resources"] = worker_group_resources(stage=stage, gpus_per_node=pool.gpus_per_node)
    pod = group["template"]
    pod["metadata"] = {"labels": {**labels, POOL_LABEL: stage}}
    pod_spec = pod["spec"]
    pod_spec["serviceAccountName"] = RAY_SERVICE_ACCOUNT
    pod_spec["nodeSelector"] = dict(node_selector)
    container = pod_spec["containers"][0]
    container["image"] = image
    container["env"] = _secret_env()
    amounts = worker_amounts(instance=instance, gpus_per_node=pool.gpus_per_node)
    if instance.has_efa:
        amounts["vpc.amazonaws.com/efa"] = str(instance.efa_interfaces)
        pod_spec["tolerations"].append({"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"})
        # No LD_LIBRARY_PATH: the image sets it, libfabric first before its own entries (deploy/runtime/
        # Dockerfile). A pod's value would replace the image's, and Kubernetes' $(VAR) cannot read an image's env.
        container["env"].append({"name": "FI_PROVIDER", "value": "efa"})
        if hugepages:
            amounts["hugepages-2Mi"] = EFA_HUGEPAGES
        else:
            # No hugepages reserved on the node: a pod without a hugepages limit that maps some dies of SIGBUS,
            # so libfabric must not try (its default is to use them).
            container["env"].append({"name": "FI_EFA_USE_HUGE_PAGE", "value": "0"})
    container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    return group


def _sized_as_spec(cluster: dict, spec: DeploymentSpec) -> dict:
    """The Ray cluster part with each worker group at the spec's node count (what it is outside a rollout)."""
    sized = copy.deepcopy(cluster)
    for group in sized["workerGroupSpecs"]:
        nodes = spec.pool(group["groupName"]).nodes
        group.update(replicas=nodes, minReplicas=nodes, maxReplicas=nodes)
    return sized


def rayservice_build(*, name: str, namespace: str, team_slug: str, spec: DeploymentSpec, target_kind: str,
                     image: str, node_selectors: dict[str, dict], replicas: dict[str, int] | None = None,
                     generation_of: str = "") -> dict:
    """The RayService: head group, prefill and decode worker groups, serveConfigV2 from the one serve config.

    `replicas` fixes each pool's Serve replicas and sizes its worker group to the nodes they need (a side-by-side
    rollout's application, deployments.surge); None: the spec's replica bounds on the spec's nodes.
    EFA hugepages are asked for only on `eks`, whose EFA node groups reserve EFA_HUGEPAGES in their user data
    (workers.targets.eks); another cluster's nodes have none unless its operator set them aside. `image` is what
    the head and both pools run (deployments.runtime_images): one Python environment across the Ray cluster."""
    runtime = RUNTIMES[spec.runtime]
    labels = _labels(team_slug=team_slug, name=name, generation_of=generation_of)
    rs = template("rayservice.yaml")
    rs["metadata"] = {"name": name, "namespace": namespace, "labels": labels}
    serve = serve_config_build(app_name=name, spec=spec, target_kind=target_kind, replicas=replicas)
    rs["spec"]["serveConfigV2"] = yaml_dump(serve, sort_keys=False)
    cluster = rs["spec"]["rayClusterConfig"]
    cluster["rayVersion"] = runtime.ray  # the image's Ray: the runtime names the versions its images hold
    head = cluster["headGroupSpec"]["template"]
    head["metadata"] = {"labels": {**labels, POOL_LABEL: "head"}}
    head["spec"]["serviceAccountName"] = RAY_SERVICE_ACCOUNT
    head["spec"]["containers"][0]["image"] = image
    cluster["workerGroupSpecs"] = [
        _worker_group(stage=stage, pool=spec.pool(stage), image=image, labels=labels,
                      node_selector=node_selectors[stage], hugepages=target_kind == "eks",
                      nodes=spec.pool(stage).nodes if replicas is None
                      else nodes_for_replicas(spec.pool(stage), replicas[stage]))
        for stage in STAGES
    ]
    # KubeRay upgrades a changed Ray cluster by starting a second one beside it (NewCluster), which fixed-size node
    # groups never have room for. Tandem recreates the RayService instead, and says so (workers.targets.kubernetes);
    # this hash tells the driver when the Ray cluster part changed. Worker group sizes are left out, as KubeRay
    # leaves them out of its own: a rollout's fixed replicas resize a running Ray cluster in place, never recreate it.
    rs["metadata"]["annotations"] = {RAY_CLUSTER_HASH_ANNOTATION: content_hash(_sized_as_spec(cluster, spec))}
    return _stamp(rs)


def service_account_build(*, namespace: str, team_slug: str, role_arn: str = "") -> dict:
    """The team's service account for its Ray pods; annotated with the team's IAM role (IRSA) when it has one."""
    sa = template("service_account.yaml")
    sa["metadata"] = {"name": RAY_SERVICE_ACCOUNT, "namespace": namespace,
                      "labels": {**MANAGED_BY, TEAM_LABEL: team_slug}}
    if role_arn:
        sa["metadata"]["annotations"] = {IRSA_ANNOTATION: role_arn}
    return _stamp(sa)


def manifests_build(*, name: str, namespace: str, team_slug: str, spec: DeploymentSpec, target_kind: str,
                    image: str, node_selectors: dict[str, dict] | None = None, role_arn: str = "",
                    replicas: dict[str, int] | None = None, generation_of: str = "") -> list[dict]:
    """Namespace, the team's Ray service account, endpoint Service and RayService for one application of a
    deployment (the RayService last), each with its spec-hash annotation; `image` is what every Ray pod runs. `name`
    is the application's (deployments.serve_config.serve_app_name); `generation_of` the deployment's name when the
    application is a later generation's, whose endpoint Service then selects only its own head pod."""
    if node_selectors is None:
        node_selectors = {s: {INSTANCE_TYPE_LABEL: spec.pool(s).instance_type} for s in STAGES}
    labels = _labels(team_slug=team_slug, name=name, generation_of=generation_of)
    ns = template("namespace.yaml")
    ns["metadata"] = {"name": namespace, "labels": {**MANAGED_BY, TEAM_LABEL: team_slug}}
    svc = template("service.yaml")
    svc["metadata"] = {"name": f"{name}-endpoint", "namespace": namespace, "labels": labels}
    svc["spec"]["selector"][DEPLOYMENT_LABEL] = name
    rs = rayservice_build(name=name, namespace=namespace, team_slug=team_slug, spec=spec,
                          target_kind=target_kind, image=image, node_selectors=node_selectors, replicas=replicas,
                          generation_of=generation_of)
    sa = service_account_build(namespace=namespace, team_slug=team_slug, role_arn=role_arn)
    return [_stamp(ns), sa, _stamp(svc), rs]


def rayservice_image(rs: dict) -> str:
    """The image a RayService's Ray pods run (its head's: every group runs the same one)."""
    return rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


def namespace_guards_build(*, namespace: str, team_slug: str, kuberay_namespace_labels: dict[str, str],
                           prometheus_namespace_labels: dict[str, str]) -> list[dict]:
    """What a team namespace holds before anything runs in it: the RoleBinding that gives Tandem's worker its rights
    there, and the NetworkPolicies that keep every other pod of the cluster away from the team's Ray pods (the
    KubeRay operator and Prometheus let in from the namespaces with these labels; Prometheus not at all without)."""
    labels = {**MANAGED_BY, TEAM_LABEL: team_slug}
    binding = template("role_binding.yaml")
    policies = template("network_policies.yaml")
    rules = policies[-1]["spec"]["ingress"]
    rules.append({"from": [{"namespaceSelector": {"matchLabels": dict(kuberay_namespace_labels)},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}],
                  "ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8265}]})
    if prometheus_namespace_labels:
        rules.append({"from": [{"namespaceSelector": {"matchLabels": dict(prometheus_namespace_labels)}}],
                      "ports": [{"protocol": "TCP", "port": 8080}]})
    for obj in (binding, *policies):
        obj["metadata"].update(namespace=namespace, labels=dict(labels))
    return [_stamp(o) for o in (binding, *policies)]


def manifests_hash(objects: list[dict]) -> str:
    """One hash over all objects' spec-hash annotations: the deployment's desired state."""
    return content_hash([o["metadata"]["annotations"][HASH_ANNOTATION] for o in objects])


def endpoint_url(*, name: str, namespace: str) -> str:
    """The in-cluster base URL of the endpoint Service (what an in-cluster gateway forwards to)."""
    return f"http://{name}-endpoint.{namespace}.svc.cluster.local:8000"
