"""The `kubernetes` target: a RayService (KubeRay) plus its namespace and endpoint Service, on any cluster.

Apply is create-or-replace and safe to repeat: each object is read, created when absent, and replaced (with the
read resourceVersion, so a concurrent writer gets a 409 and we retry) only when its spec-hash annotation differs.
Status comes from the RayService's `status.conditions` (Ready) and `activeServiceStatus.applicationStatuses`;
while it is not ready, the scheduler's reason for any Pending pod of the deployment is added, per pool.

A RayService written is read back: a field the API server dropped (a KubeRay CRD older than the runtime needs) or
a value Tandem relies on that came back otherwise fails the deployment in that pass, and the RayService is removed.
A change to its Ray cluster part is a deletion and a creation, said in the step's message (upgradeStrategy None;
KubeRay's NewCluster never completes on fixed-size node groups). The team's Hugging Face token, named by the
cluster's `hf_token_refs`, is copied into the team namespace before the RayService, never into a manifest.
A namespace that exists without Tandem's labels for this team is someone else's: Tandem refuses to adopt,
relabel or delete it, and never deletes an object in it. A team namespace Tandem makes is created, never rewritten;
right after it come the RoleBinding that gives the worker its rights there (cluster-wide it has none in namespaces)
and the NetworkPolicies that keep the rest of the cluster away from the team's Ray pods.
"""
import base64
import json
from collections.abc import Callable

import urllib3
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from deployments.applied_check import applied_differences, applied_mismatch_message
from deployments.catalog import RUNTIMES
from deployments.manifests import (DEPLOYMENT_LABEL, GENERATION_OF_LABEL, HASH_ANNOTATION, MANAGED_BY, MODEL_SECRET,
                                  POOL_LABEL, RAY_CLUSTER_HASH_ANNOTATION, TEAM_LABEL, endpoint_url, manifests_build,
                                  manifests_hash, namespace_guards_build, namespace_name, rayservice_image)
from deployments.runtime_images import public_image_note, runtime_image_errors, runtime_image_of
from deployments.secret_refs import SecretRefError, secret_resolve
from deployments.serve_config import serve_app_name
from deployments.team_roles import team_role_arn
from workers import clients
from workers.diagnosis import Finding, pod_findings, serve_findings
from workers.targets.base import AppUnit, Observed, PermanentError, Step, Target, TransientError, live_unit
from workers.targets.serve_status import serve_app_message

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayservices"
TIMEOUT = (5, 20)  # connect, read seconds for every API call
KUBERAY_MIN = max((r.kuberay_min for r in RUNTIMES.values() if r.kuberay_min),
                  key=lambda v: tuple(int(n) for n in v.split(".")))  # what every runtime on Kubernetes runs on
ENGINE_LOG_LINES = 2000  # per pod: NIXL reports its backends as the engine starts, before any traffic
LAST_RUN_LINES = 20  # of a crashed container's previous run: where its cause is


KUBECONFIG_ACCESS = "check the kubeconfig's user and its RBAC"


def api_error(e: Exception, *, doing: str, cluster: str, access: str = KUBECONFIG_ACCESS) -> Exception:
    """Classify a Kubernetes client failure as transient (retry) or permanent (tell the user)."""
    if isinstance(e, (urllib3.exceptions.HTTPError, OSError)):
        return TransientError(f"Cannot reach the Kubernetes API of {cluster} while {doing}: {type(e).__name__}.")
    if not isinstance(e, ApiException):
        return e
    status, reason = e.status or 0, _status_message(e)
    if status == 429:
        retry_after = (e.headers or {}).get("Retry-After")
        hint = float(retry_after) if retry_after and retry_after.isdigit() else None
        return TransientError(f"The Kubernetes API of {cluster} is throttling ({doing}); retrying.", retry_after=hint)
    if status in (409, 410) or status >= 500:
        return TransientError(f"Kubernetes answered {status} while {doing} on {cluster}: {reason}; retrying.")
    if status in (401, 403):
        return PermanentError(f"Kubernetes refused Tandem's credentials on {cluster} ({status}) while {doing}: "
                              f"{access} (Tandem needs to manage namespaces, services and ray.io rayservices).")
    if status in (400, 422):
        return PermanentError(f"Kubernetes rejected the manifest while {doing} on {cluster}: {reason}")
    return PermanentError(f"Kubernetes answered {status} while {doing} on {cluster}: {reason}")


def _pod_ready(pod: dict) -> bool:
    """Whether a pod runs and reports Ready."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _labelled(labels: dict | None, wanted: dict) -> bool:
    """Whether an object carries every one of `wanted` labels (Tandem's ownership marks)."""
    return all((labels or {}).get(k) == v for k, v in wanted.items())


def _same_application(current: dict, obj: dict) -> bool:
    """Whether an existing RayService or endpoint Service is the application `obj` describes: Tandem's labels for
    it, and the same deployment behind a later generation's name (deployment `a`'s generation 2 is named `a-g2`,
    as a deployment `a-g2` of the same team would be)."""
    labels, wanted = current.get("metadata", {}).get("labels") or {}, obj["metadata"]["labels"]
    return _labelled(labels, wanted) and labels.get(GENERATION_OF_LABEL) == wanted.get(GENERATION_OF_LABEL)


def _applied_hash(desired: dict, current: dict | None) -> str:
    """The spec hash of what is applied: a namespace carrying this team's labels is as desired (Tandem creates it and
    never rewrites it: its labels are all there is to it); any other object says so in its annotation."""
    if current is None:
        return ""
    if desired["kind"] == "Namespace" and _labelled(current["metadata"].get("labels"), desired["metadata"]["labels"]):
        return desired["metadata"]["annotations"][HASH_ANNOTATION]
    return (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION, "")


def _cluster_hash(rs: dict) -> str:
    return (rs.get("metadata", {}).get("annotations") or {}).get(RAY_CLUSTER_HASH_ANNOTATION, "")


def _status_message(e: ApiException) -> str:
    try:
        return json.loads(e.body or "{}").get("message") or e.reason or ""
    except ValueError:
        return e.reason or ""


class KubernetesTarget(Target):
    """Drives a deployment onto a Kubernetes cluster that runs KubeRay."""

    ACCESS = KUBECONFIG_ACCESS  # what to check when the API server refuses the credentials

    def __init__(self, cluster, *, api: k8s.ApiClient | None = None):
        super().__init__(cluster)
        self._api = api

    # --- clients --------------------------------------------------------------------------------------
    @property
    def api(self) -> k8s.ApiClient:
        if self._api is None:
            self._api = self.build_api()
        return self._api

    def build_api(self) -> k8s.ApiClient:
        """The API client for this cluster (the eks driver overrides this)."""
        return clients.kubernetes_api_from_kubeconfig(secret_ref=self.cluster.secret_ref,
                                                      context=self.config.context)

    def _call(self, doing: str, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, _request_timeout=TIMEOUT, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing=doing, cluster=self.cluster.name, access=self.ACCESS) from None

    def _get(self, doing: str, fn: Callable, *args, absent: tuple[int, ...] = (404,)):
        """Read one object as a dict, or None when it does not exist (the API server answers one of `absent`)."""
        try:
            result = fn(*args, _request_timeout=TIMEOUT)
        except ApiException as e:
            if e.status in absent:
                return None
            raise api_error(e, doing=doing, cluster=self.cluster.name, access=self.ACCESS) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing=doing, cluster=self.cluster.name, access=self.ACCESS) from None
        return result if isinstance(result, dict) else self.api.sanitize_for_serialization(result)

    # --- names ----------------------------------------------------------------------------------------
    def namespace(self, deployment) -> str:
        prefix = self.config.namespace_prefix
        return namespace_name(prefix=prefix, team_slug=deployment.team.slug)

    def node_selectors(self, deployment) -> dict[str, dict] | None:
        """Node labels each pool is pinned to; None lets manifests pin by instance type."""
        return None

    # --- the contract ---------------------------------------------------------------------------------
    def team_role(self, deployment) -> str:
        """The IAM role the team's Ray pods assume (IRSA), from the cluster's `team_roles`; "" for none."""
        return team_role_arn(self.config, deployment.team.slug) or ""

    def app_name(self, deployment, unit: AppUnit | None = None) -> str:
        """The name of the unit's RayService and Serve application (None: the live unit's)."""
        generation = (unit or live_unit(deployment)).app_generation
        return serve_app_name(deployment_id=deployment.pk, name=deployment.name, target_kind=self.cluster.kind,
                              app_generation=generation)

    def runtime_image(self, spec) -> str:
        """The image every Ray pod of the spec runs on this cluster (deployments.runtime_images); a cluster with none
        it may use is a PermanentError saying how to register one."""
        image = runtime_image_of(kind=self.cluster.kind, config=self.config, spec=spec)
        if image is None:
            raise PermanentError(" ".join(runtime_image_errors(cluster=self.cluster, spec=spec)))
        return image.ref

    def desired(self, deployment, unit: AppUnit | None = None) -> tuple[list[dict], str]:
        """The unit's objects (None: the live unit's): a later generation is a RayService of its own, named for it,
        with its own endpoint Service; fixed replicas size its Serve deployments and worker groups."""
        unit = unit or live_unit(deployment)
        objects = self._objects(deployment, unit, image=self.runtime_image(unit.spec))
        return objects, manifests_hash(objects)

    def _objects(self, deployment, unit: AppUnit, *, image: str) -> list[dict]:
        namespace, team_slug = self.namespace(deployment), deployment.team.slug
        ns, *rest = manifests_build(name=self.app_name(deployment, unit), namespace=namespace, team_slug=team_slug,
                                    spec=unit.spec, target_kind=self.cluster.kind, image=image,
                                    node_selectors=self.node_selectors(deployment), role_arn=self.team_role(deployment),
                                    replicas=unit.replicas,
                                    generation_of=deployment.name if unit.app_generation else "")
        guards = namespace_guards_build(namespace=namespace, team_slug=team_slug,
                                        kuberay_namespace_labels=settings.TANDEM_KUBERAY_NAMESPACE_LABELS,
                                        prometheus_namespace_labels=settings.TANDEM_PROMETHEUS_NAMESPACE_LABELS)
        return [ns, *guards, *rest]  # the RoleBinding before anything that needs it, the RayService last

    def _read(self, obj: dict) -> dict | None:
        kind, meta = obj["kind"], obj["metadata"]
        core = k8s.CoreV1Api(self.api)
        if kind == "Namespace":
            return self._get("reading the namespace", core.read_namespace, meta["name"])
        if kind == "Service":
            return self._get("reading the endpoint Service", core.read_namespaced_service, meta["name"],
                             meta["namespace"])
        if kind == "ServiceAccount":
            return self._get("reading the Ray service account", core.read_namespaced_service_account, meta["name"],
                             meta["namespace"])
        if kind == "RoleBinding":
            # Until it exists the worker may not read it: the API server answers 403, not 404.
            return self._get("reading Tandem's RoleBinding",
                             k8s.RbacAuthorizationV1Api(self.api).read_namespaced_role_binding, meta["name"],
                             meta["namespace"], absent=(403, 404))
        if kind == "NetworkPolicy":
            return self._get("reading a NetworkPolicy", k8s.NetworkingV1Api(self.api).read_namespaced_network_policy,
                             meta["name"], meta["namespace"])
        return self._get("reading the RayService", k8s.CustomObjectsApi(self.api).get_namespaced_custom_object,
                         GROUP, VERSION, meta["namespace"], PLURAL, meta["name"])

    def observe(self, deployment, desired: list[dict] | None = None, unit: AppUnit | None = None) -> Observed:
        objects = desired if desired is not None else self.desired(deployment, unit)[0]
        found = []
        for obj in objects:
            found.append(current := self._read(obj))
            if current is None and obj["kind"] in ("Namespace", "RoleBinding"):
                break  # nothing in the namespace exists, or may be read, without it
        if found[0] is None:
            return Observed(exists=False)
        if len(found) < len(objects):
            return Observed(exists=True, message=f"Tandem's RoleBinding in namespace {self.namespace(deployment)} "
                                                 "is missing; re-applying.")
        rs = found[-1]
        if rs is None:
            return Observed(exists=False)
        hashes = [_applied_hash(o, f) for o, f in zip(objects, found)]
        applied = manifests_hash([{"metadata": {"annotations": {HASH_ANNOTATION: h}}} for h in hashes]) \
            if all(hashes) else ""
        app = rs["metadata"]["name"]
        serve_status, message, ready, app_status = self._serve_status(rs, app)
        groups = (rs.get("spec") or {}).get("rayClusterConfig", {}).get("workerGroupSpecs") or []
        return Observed(exists=True, applied_hash=applied, serve_status=serve_status, message=message,
                        endpoint_url=endpoint_url(name=app, namespace=self.namespace(deployment)),
                        details={"ready": ready, "numServeEndpoints": rs.get("status", {}).get("numServeEndpoints", 0),
                                 "app": app, "serve_app": app_status,
                                 "pods": 1 + sum(g.get("replicas", 1) * g.get("numOfHosts", 1) for g in groups)})

    def endpoint_url(self, deployment, unit: AppUnit | None = None) -> str:
        """The in-cluster URL of the unit's endpoint Service (None: the live unit's)."""
        return endpoint_url(name=self.app_name(deployment, unit), namespace=self.namespace(deployment))

    def diagnose(self, deployment, observed: Observed) -> list[Finding]:
        """What the application's pods and Serve report wrong (workers.diagnosis): the scheduler's reason for a pod
        it cannot place, a container's waiting or failed state (with a crashing container's last log lines), a
        pod the kubelet evicted, and what Serve says of each deployment; a placement is hopeless only once every
        pod of the Ray cluster runs and is ready. A role without pods/list still gets Serve's side."""
        app, namespace = observed.details.get("app", ""), self.namespace(deployment)
        try:
            found = k8s.CoreV1Api(self.api).list_namespaced_pod(namespace, label_selector=f"{DEPLOYMENT_LABEL}={app}",
                                                                 _request_timeout=TIMEOUT)
            pods = self.api.sanitize_for_serialization(found).get("items", [])
        except ApiException as e:
            if e.status not in (403, 404):
                raise api_error(e, doing="listing the Ray pods", cluster=self.cluster.name, access=self.ACCESS) \
                    from None
            pods = []
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing="listing the Ray pods", cluster=self.cluster.name, access=self.ACCESS) from None
        complete = len(pods) >= observed.details.get("pods", 1) and all(_pod_ready(p) for p in pods)
        findings = pod_findings(pods, stage_of=lambda p: (p["metadata"].get("labels") or {}).get(POOL_LABEL, "ray"),
                                last_log=lambda pod, container: self._pod_log(
                                    pod, namespace, lines=LAST_RUN_LINES, previous=True, container=container,
                                    unreadable=(400, 403, 404)))
        return findings + serve_findings(observed.details.get("serve_app") or {}, cluster_complete=complete)

    @staticmethod
    def _serve_status(rs: dict, app: str) -> tuple[str, str, bool, dict]:
        """Serve's status of the application, its message, whether the RayService is Ready, and KubeRay's copy of
        what Serve says of the application and each of its deployments (empty while KubeRay has not acted on the
        latest spec: what it shows is the previous one's)."""
        status = rs.get("status") or {}
        generation = rs.get("metadata", {}).get("generation")
        if generation is not None and status.get("observedGeneration") != generation:
            return "DEPLOYING", "KubeRay has not acted on the latest spec yet.", False, {}
        ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
        apps = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
        app_status = apps.get(app, {})
        is_ready = bool(ready and ready.get("status") == "True")
        if app_status.get("status") == "RUNNING" and is_ready:
            return "RUNNING", ready.get("message", ""), True, app_status
        message = serve_app_message(app_status) or (ready or {}).get("message") or "Waiting for KubeRay."
        return app_status.get("status") or "DEPLOYING", message, is_ready, app_status

    def _require_crd(self) -> None:
        """Refuse, with what to install, when the cluster does not serve ray.io/v1 rayservices."""
        found = self._get("looking for KubeRay", k8s.CustomObjectsApi(self.api).get_api_resources, GROUP, VERSION)
        if not any(r.get("name") == PLURAL for r in (found or {}).get("resources", [])):
            raise PermanentError(f"KubeRay is not installed on {self.cluster.name}: the RayService CRD "
                                 f"({PLURAL}.{GROUP}/{VERSION}) is missing. Install KubeRay {KUBERAY_MIN} or newer.")

    def _require_our_namespace(self, ns: dict, wanted: dict) -> None:
        """Refuse a namespace Tandem did not make for this team (an existing one of the same name)."""
        labels, want = ns.get("metadata", {}).get("labels") or {}, wanted["metadata"]["labels"]
        if _labelled(labels, want):
            return
        name = wanted["metadata"]["name"]
        owner = (f"Tandem's namespace of team {labels[TEAM_LABEL]}" if _labelled(labels, MANAGED_BY) and
                 labels.get(TEAM_LABEL) else "not Tandem's (it lacks the app.kubernetes.io/managed-by=tandem label)")
        raise PermanentError(f"Namespace {name} already exists on {self.cluster.name} and is {owner}; Tandem will "
                             f"not adopt, relabel or delete it for team {want[TEAM_LABEL]}. Remove that namespace "
                             "or give the cluster another namespace_prefix, then retry.")

    def apply(self, deployment, desired: list[dict]) -> Step:
        """Create what is missing and replace what changed; leave the rest alone."""
        self._require_crd()
        done, unchanged = [], []
        for obj in desired:
            current = self._read(obj)
            if obj["kind"] == "Namespace" and current is not None:
                self._require_our_namespace(current, obj)
            label = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}".replace(" /", " ")
            if current is None:
                self._create(obj)
                done.append(f"created {label}")
            elif obj["kind"] in ("RayService", "Service") and not _same_application(current, obj):
                raise PermanentError(f"{label} on {self.cluster.name} is not this deployment's application (its "
                                     "labels name another); Tandem will not replace it. Rename or remove it, then "
                                     "retry.")
            elif current.get("metadata", {}).get("deletionTimestamp"):
                raise TransientError(f"The previous {label} is still being deleted; creating the new one once it "
                                     "is gone.")
            elif obj["kind"] == "Namespace":
                unchanged.append(obj["kind"])  # ours (checked above), and created once: never rewritten
            elif current.get("metadata", {}).get("annotations", {}).get(HASH_ANNOTATION) != \
                    obj["metadata"]["annotations"][HASH_ANNOTATION]:
                if obj["kind"] == "RayService" and _cluster_hash(current) != _cluster_hash(obj):
                    self._recreate(obj)
                    done.append(f"recreated {label}: its Ray cluster changed, which KubeRay does not upgrade in "
                                "place on fixed-size node groups; it serves again once the new Ray cluster is ready")
                else:
                    self._replace(obj, current)
                    done.append(f"updated {label}")
            else:
                unchanged.append(obj["kind"])
            if obj["kind"] == "RoleBinding":  # once the worker may write in the namespace, before any pod starts
                done += self._copy_model_secret(deployment, obj["metadata"]["namespace"])
            elif obj["kind"] == "RayService" and unchanged[-1:] != ["RayService"]:
                self._require_kept(deployment, obj)
                if note := public_image_note(rayservice_image(obj)):
                    done.append(note)
        message = "; ".join(done) or "nothing changed"
        if unchanged:
            message += f" (unchanged: {', '.join(unchanged)})"
        return Step(ready=True, message=message)

    def _copy_model_secret(self, deployment, namespace: str) -> list[str]:
        """Copy the team's Hugging Face token (the cluster's `hf_token_refs`, resolved here and nowhere else) into
        the Secret its Ray pods read HF_TOKEN from. Written without reading the Secret back, so the driver needs
        no right to read secrets: created, or replaced when it exists. Nothing is done for a team without one."""
        ref = self.config.hf_token_refs.get(deployment.team.slug)
        if not ref:
            return []
        try:
            token = secret_resolve(ref)
        except SecretRefError as e:
            raise PermanentError(f"The Hugging Face token of team {deployment.team.slug} on {self.cluster.name} "
                                 f"cannot be read: {e} Fix hf_token_refs in the cluster's settings, then retry."
                                 ) from None
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": MODEL_SECRET, "namespace": namespace,
                               "labels": {**MANAGED_BY, TEAM_LABEL: deployment.team.slug}},
                  "data": {"HF_TOKEN": base64.b64encode(token.encode()).decode()}}
        core = k8s.CoreV1Api(self.api)
        try:
            core.create_namespaced_secret(namespace, secret, _request_timeout=TIMEOUT)
            verb = "copied"
        except ApiException as e:
            if e.status != 409:
                raise api_error(e, doing="copying the team's Hugging Face token", cluster=self.cluster.name,
                                access=self.ACCESS) from None
            self._call("updating the team's Hugging Face token", core.replace_namespaced_secret, MODEL_SECRET,
                       namespace, secret)
            verb = "refreshed"
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing="copying the team's Hugging Face token", cluster=self.cluster.name,
                            access=self.ACCESS) from None
        return [f"{verb} team {deployment.team.slug}'s Hugging Face token into Secret {namespace}/{MODEL_SECRET}"]

    def _recreate(self, rs: dict) -> None:
        """Delete the RayService and create it anew (its Ray cluster with it): an announced recreation, with
        downtime, until zero-downtime upgrades exist."""
        meta = rs["metadata"]
        custom = k8s.CustomObjectsApi(self.api)
        self._delete("deleting the RayService to recreate it", lambda: custom.delete_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], _request_timeout=TIMEOUT))
        if (left := self._read(rs)) is not None and left.get("metadata", {}).get("deletionTimestamp"):
            raise TransientError(f"The RayService {meta['name']} is being deleted to be recreated; retrying.")
        self._create(rs)

    def _require_kept(self, deployment, rs: dict) -> None:
        """Read the RayService back and compare it with what was written: a field the API server dropped (a
        KubeRay CRD older than the runtime needs) or changed fails the deployment now, naming the field and the
        KubeRay release that keeps it, instead of leaving it DEPLOYING for ever. The RayService is removed: it
        would hold GPU nodes (and run Ray without its token) with no chance of serving."""
        stored = self._read(rs)
        if stored is None:
            raise TransientError(f"The RayService {rs['metadata']['name']} was written to {self.cluster.name} but "
                                 "does not read back yet; retrying.")
        dropped, changed = applied_differences(rs["spec"], stored.get("spec") or {})
        if not dropped and not changed:
            return
        meta = rs["metadata"]
        self._delete("removing the RayService KubeRay cannot run",
                     lambda: k8s.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                         GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], _request_timeout=TIMEOUT))
        raise PermanentError(applied_mismatch_message(
            dropped=dropped, changed=changed, cluster=self.cluster.name,
            kuberay_min=RUNTIMES[deployment.spec_typed.runtime].kuberay_min))

    def _create(self, obj: dict) -> None:
        kind, meta = obj["kind"], obj["metadata"]
        core = k8s.CoreV1Api(self.api)
        try:
            if kind == "Namespace":
                core.create_namespace(obj, _request_timeout=TIMEOUT)
            elif kind == "Service":
                core.create_namespaced_service(meta["namespace"], obj, _request_timeout=TIMEOUT)
            elif kind == "ServiceAccount":
                core.create_namespaced_service_account(meta["namespace"], obj, _request_timeout=TIMEOUT)
            elif kind == "RoleBinding":
                k8s.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(meta["namespace"], obj,
                                                                                   _request_timeout=TIMEOUT)
            elif kind == "NetworkPolicy":
                k8s.NetworkingV1Api(self.api).create_namespaced_network_policy(meta["namespace"], obj,
                                                                              _request_timeout=TIMEOUT)
            else:
                k8s.CustomObjectsApi(self.api).create_namespaced_custom_object(
                    GROUP, VERSION, meta["namespace"], PLURAL, obj, _request_timeout=TIMEOUT)
        except ApiException as e:
            # A namespace made since we read it is fine if it is ours (another worker); anyone else's is refused.
            if e.status == 409 and kind == "Namespace" and (current := self._read(obj)) is not None:
                return self._require_our_namespace(current, obj)
            if e.status == 409 and kind == "RoleBinding":
                if self._read(obj) is not None:
                    return None  # another worker made it since we looked
                # there, yet unreadable: not the binding Tandem made
                raise PermanentError(f"A RoleBinding {meta['name']} in namespace {meta['namespace']} on "
                                     f"{self.cluster.name} is not the one Tandem made (Tandem may not read it). "
                                     f"Delete it (kubectl -n {meta['namespace']} delete rolebinding {meta['name']}) "
                                     "and retry: Tandem creates it again.") from None
            raise api_error(e, doing=f"creating the {kind}", cluster=self.cluster.name, access=self.ACCESS) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing=f"creating the {kind}", cluster=self.cluster.name, access=self.ACCESS) from None

    def _replace(self, obj: dict, current: dict) -> None:
        kind, meta = obj["kind"], obj["metadata"]
        core = k8s.CoreV1Api(self.api)
        # A replace (with the resourceVersion read) unless said otherwise: what was dropped from the object must go.
        body = {**obj, "metadata": {**meta, "resourceVersion": current["metadata"].get("resourceVersion")}}
        if kind == "ServiceAccount":  # a role taken away takes its annotation with it
            self._call("updating the Ray service account", core.replace_namespaced_service_account, meta["name"],
                       meta["namespace"], body)
        elif kind == "RoleBinding":
            self._call("updating Tandem's RoleBinding",
                       k8s.RbacAuthorizationV1Api(self.api).replace_namespaced_role_binding, meta["name"],
                       meta["namespace"], body)
        elif kind == "NetworkPolicy":
            self._call("updating a NetworkPolicy", k8s.NetworkingV1Api(self.api).replace_namespaced_network_policy,
                       meta["name"], meta["namespace"], body)
        elif kind == "Service":
            # A merge patch keeps the clusterIP the API server assigned (a replace would have to copy it).
            self._call("updating the endpoint Service", core.patch_namespaced_service, meta["name"],
                       meta["namespace"], {"metadata": meta, "spec": obj["spec"]})
        else:  # keys dropped from the spec (e.g. EFA devices) go away too
            self._call("updating the RayService", k8s.CustomObjectsApi(self.api).replace_namespaced_custom_object,
                       GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body)

    def teardown(self, deployment, unit: AppUnit | None = None) -> Step:
        """Delete the unit's RayService and endpoint Service; None: every application of the deployment (each
        generation's), then the team namespace once nothing of Tandem's is left in it."""
        units = [unit] if unit is not None else self._units_present(deployment)
        custom, core = k8s.CustomObjectsApi(self.api), k8s.CoreV1Api(self.api)
        namespace, remaining = self.namespace(deployment), []
        for u in units:
            objects = self._objects(deployment, u, image="")  # names and labels: the image plays no part
            # The team's service account, RoleBinding and NetworkPolicies go with its namespace.
            svc, rs = (next(o for o in objects if o["kind"] == kind) for kind in ("Service", "RayService"))
            for obj, delete in ((rs, lambda name=rs["metadata"]["name"]: custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, _request_timeout=TIMEOUT)),
                                (svc, lambda name=svc["metadata"]["name"]: core.delete_namespaced_service(
                                    name, namespace, _request_timeout=TIMEOUT))):
                current = self._read(obj)
                if current is None or not _same_application(current, obj):
                    continue  # gone, or not this deployment's: never delete what Tandem did not make
                self._delete(f"deleting the {obj['kind']}", delete)
                if self._read(obj) is not None:
                    remaining.append(f"{obj['kind']} {obj['metadata']['name']}")
        if remaining:
            return Step(ready=False, message=f"Waiting for {', '.join(remaining)} to go away.")
        if unit is not None:
            return Step(ready=True, message=f"Deleted RayService {self.app_name(deployment, unit)} and its endpoint "
                                            f"Service in {namespace}.")
        ns_obj = self._objects(deployment, live_unit(deployment), image="")[0]
        if self._namespace_release(namespace, deployment.team.slug) and self._read(ns_obj) is not None:
            return Step(ready=False, message=f"Waiting for namespace {namespace} to go away.")
        return Step(ready=True, message=f"Deleted the RayService and endpoint Service in {namespace}.")

    def _units_present(self, deployment) -> list[AppUnit]:
        """Every application of the deployment that may exist: its first, its live one, and each later generation's
        RayService found in the team namespace (a rollout's, old or new)."""
        spec = deployment.spec_typed  # names and labels do not depend on it
        generations = {0, live_unit(deployment).app_generation}
        if self._get("reading the namespace", k8s.CoreV1Api(self.api).read_namespace,
                     self.namespace(deployment)) is not None:
            found = self._call("listing RayServices", k8s.CustomObjectsApi(self.api).list_namespaced_custom_object,
                               GROUP, VERSION, self.namespace(deployment), PLURAL,
                               label_selector=f"{GENERATION_OF_LABEL}={deployment.name}")
            for rs in (found or {}).get("items", []):
                suffix = rs["metadata"]["name"].removeprefix(f"{deployment.name}-g")
                if suffix.isdigit():
                    generations.add(int(suffix))
        return [AppUnit(app_generation=g, spec=spec) for g in sorted(generations)]

    def _delete(self, doing: str, fn: Callable) -> None:
        try:
            fn()
        except ApiException as e:
            if e.status != 404:
                raise api_error(e, doing=doing, cluster=self.cluster.name, access=self.ACCESS) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing=doing, cluster=self.cluster.name, access=self.ACCESS) from None

    def _namespace_release(self, namespace: str, team_slug: str) -> bool:
        """Delete the team namespace when it is this team's and no RayService of Tandem's is left in it; whether
        it is being deleted (False: gone already, someone else's, or still holding the team's other deployments)."""
        ns = self._get("reading the namespace", k8s.CoreV1Api(self.api).read_namespace, namespace)
        if ns is None:
            return False
        if not _labelled(ns.get("metadata", {}).get("labels"), {**MANAGED_BY, TEAM_LABEL: team_slug}):
            return False  # someone else's namespace: never delete it
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        left = self._call("listing RayServices", k8s.CustomObjectsApi(self.api).list_namespaced_custom_object,
                          GROUP, VERSION, namespace, PLURAL, label_selector=selector)
        if (left or {}).get("items"):
            return False
        self._delete("deleting the namespace",
                     lambda: k8s.CoreV1Api(self.api).delete_namespace(namespace, _request_timeout=TIMEOUT))
        return True

    def engine_logs(self, deployment) -> dict[str, str]:
        """The last lines of each stage's worker pods (where the engines run, with NIXL's own messages)."""
        core, namespace, logs = k8s.CoreV1Api(self.api), self.namespace(deployment), {}
        for stage in ("prefill", "decode"):
            selector = f"{DEPLOYMENT_LABEL}={self.app_name(deployment)},{POOL_LABEL}={stage}"
            pods = self._call(f"listing the {stage} pods", core.list_namespaced_pod, namespace,
                              label_selector=selector)
            names = [p.metadata.name for p in pods.items]
            logs[stage] = "\n".join(self._pod_log(name, namespace, lines=ENGINE_LOG_LINES) for name in names)
        return logs

    def _pod_log(self, name: str, namespace: str, *, lines: int, previous: bool = False,
                 container: str | None = None, unreadable: tuple[int, ...] = (400, 404)) -> str:
        """A pod's last `lines` lines (of its crashed container's previous run with `previous`); empty when it has
        none to read (gone: 404; its container waiting to start, or not restarted yet: 400; and any other of
        `unreadable`, e.g. a role without pods/log where the log only adds detail). Any other refusal is the
        caller's to see."""
        try:
            chosen = {"container": container} if container else {}
            return k8s.CoreV1Api(self.api).read_namespaced_pod_log(
                name, namespace, tail_lines=lines, previous=previous, _request_timeout=TIMEOUT, **chosen) or ""
        except ApiException as e:
            if e.status in unreadable:
                return ""
            raise api_error(e, doing=f"reading the logs of pod {name}", cluster=self.cluster.name,
                            access=self.ACCESS) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise api_error(e, doing=f"reading the logs of pod {name}", cluster=self.cluster.name,
                            access=self.ACCESS) from None

    def endpoint_answers(self, deployment, observed: Observed) -> Step:
        """KubeRay counts the head pods ready to serve; the in-cluster URL answers once there is one."""
        count = observed.details.get("numServeEndpoints") or 0
        if count < 1:
            return Step(ready=False, message="No Serve endpoint is ready yet.")
        return Step(ready=True, message=f"{observed.endpoint_url} ({count} serving pod(s))")
