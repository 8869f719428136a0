"""Why a deployment does not serve, read from what the cluster itself reports: pure functions from pod and Serve
statuses to findings a person can act on.

The rule is generic on purpose, so that failures nobody named are seen too: every container that waits for a reason
other than the normal ones of a starting pod (ContainerCreating, PodInitializing), every container that ended badly,
every pod the scheduler cannot place or the kubelet evicted, and every Serve deployment whose status or message says
it cannot start, is a finding in the words Kubernetes, KubeRay or Ray used. Only which of them can never heal is
named (`fatal`): an image that does not exist, a container killed for memory before it was ever ready, a Serve
deployment that failed to deploy, and a replica Ray cannot place once every pod of the Ray cluster runs and is ready
(Tandem's Ray clusters on Kubernetes have fixed worker groups: no node will come). Everything else is left to the
serving deadline (workers.pipeline), which, like `fatal`, applies only on the way to serving: once a deployment
serves, Serve replaces replicas that die.

Sources of the words: the kubelet's container state reasons (k8s.io/kubernetes pkg/kubelet/images/types.go
ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName; pkg/kubelet/kuberuntime CrashLoopBackOff,
CreateContainerConfigError, CreateContainerError; OOMKilled from the runtime; Evicted from the eviction manager),
containerd's message for a reference it cannot resolve ("rpc error: code = NotFound desc = failed to pull and unpack
image ... not found", as public.ecr.aws answered it in aquasecurity/starboard#1161), the scheduler's PodScheduled
message, and Ray Serve's deployment status message for replicas it cannot place
(ray/serve/_private/deployment_state.py: "... replicas that have taken more than 30s to be scheduled. ... Resources
required for each replica: [...], total resources available: {...}.").
"""
import re
from collections.abc import Callable
from dataclasses import dataclass

from workers.targets.serve_status import failure_cause

STARTING = {"ContainerCreating", "PodInitializing"}  # a container on its way up: nothing is wrong yet
IMAGE_PULL = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
# What the registry answers for a reference that does not exist (containerd, and registries' own words); also a
# repository the node may not read, which waiting does not fix either.
IMAGE_GONE = re.compile(r"code = NotFound|: not found\b|manifest unknown|repository does not exist|"
                        r"pull access denied|InvalidImageName|invalid reference format", re.IGNORECASE)
OOM_EXIT = 137
# Ray Serve's message for replicas whose placement group Ray cannot place yet. Its "total resources available" is
# always {} for a placement group's bundles (Ray 2.60 `resource_requirements()` filters the available resources by
# `k in required`, a list of bundles), so only what is required is worth showing.
PLACEMENT = re.compile(r"(?P<count>\d+) replicas that have taken more than \d+s to be scheduled\..*Resources required "
                       r"for each replica: (?P<required>.*?), total resources available:", re.DOTALL)
SERVE_FAILED = "DEPLOY_FAILED"  # Serve gave up starting the deployment's replicas
SERVE_UNHEALTHY = "UNHEALTHY"  # replicas failing their health checks, which Serve replaces
LOG_LINES = 3  # of a crashing container's last run, shown with the finding
MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class Finding:
    """One thing the cluster reports wrong with one stage: `stage` (head, prefill, decode, ingress), the reason
    in the reporter's own word (ImagePullBackOff, OOMKilled, PlacementPending, ...), what it said, and whether it
    can never heal by waiting."""

    stage: str
    reason: str
    message: str
    fatal: bool = False
    pods: int = 1  # how many of the stage's pods report it

    def text(self) -> str:
        pods = f" ({self.pods} pods)" if self.pods > 1 else ""
        return f"{self.stage}{pods}: {self.reason}: {self.message}"


def findings_text(findings: list["Finding"], *, limit: int = 1500) -> str:
    """Every finding on one line each, the ones that cannot heal first."""
    ordered = sorted(findings, key=lambda f: not f.fatal)
    return "\n".join(f.text() for f in ordered)[:limit]


def _short(message: str) -> str:
    """The message on one line, at most MESSAGE_LIMIT characters: its start and its end, where an error's cause is
    (containerd repeats the image reference before its `not found`)."""
    message = " ".join((message or "").split())
    if len(message) <= MESSAGE_LIMIT:
        return message
    half = MESSAGE_LIMIT // 2
    return f"{message[:half - 1]}…{message[-half:]}"


def _container_findings(stage: str, pod: dict, status: dict, *, init: bool,
                        last_log: Callable[[str, str], str]) -> list[Finding]:
    """What one container's status says is wrong (nothing while it starts or runs)."""
    name = status.get("name", "")
    where = f"init container {name}" if init else f"container {name}"
    state, last = status.get("state") or {}, status.get("lastState") or {}
    waiting, terminated = state.get("waiting"), state.get("terminated")
    ended = terminated or last.get("terminated")
    if ended and (ended.get("reason") == "OOMKilled" or ended.get("exitCode") == OOM_EXIT) and not status.get("ready"):
        limit = _memory_limit(pod, name)
        return [Finding(stage, "OOMKilled", f"{where} was killed for running out of memory (exit code "
                                            f"{ended.get('exitCode', OOM_EXIT)}) before it was ever ready"
                                            + (f"; its memory limit is {limit}" if limit else "")
                                            + ". It needs more memory than the pool's nodes give it.", fatal=True)]
    if waiting and waiting.get("reason") not in STARTING | {None}:
        reason, message = waiting["reason"], waiting.get("message") or ""
        if reason in IMAGE_PULL:
            image = status.get("image", "")
            return [Finding(stage, reason, _short(f"{where} cannot pull {image}: {message}"),
                            fatal=bool(IMAGE_GONE.search(message) or reason == "InvalidImageName"))]
        if reason == "CrashLoopBackOff":
            cause = f" (last exit: {ended.get('reason', '')} {ended.get('exitCode', '')})".replace(" )", ")") \
                if ended else ""
            logged = [line.strip() for line in (last_log(pod["metadata"]["name"], name) or "").splitlines()
                      if line.strip()]
            lines = " | ".join(logged[-LOG_LINES:])
            logged = f"; its last log lines: {lines}" if lines else ""
            return [Finding(stage, reason, _short(f"{where} keeps crashing, restarted {status.get('restartCount', 0)} "
                                                  f"times{cause}{logged}"))]
        return [Finding(stage, reason, _short(f"{where}: {message}" if message else where))]
    if terminated and terminated.get("exitCode", 0) != 0:
        return [Finding(stage, terminated.get("reason") or "Error",
                        _short(f"{where} exited with code {terminated.get('exitCode')}: "
                               f"{terminated.get('message') or ''}".rstrip(": ")))]
    return []


def _memory_limit(pod: dict, container: str) -> str:
    for c in (pod.get("spec") or {}).get("containers", []) + (pod.get("spec") or {}).get("initContainers", []):
        if c.get("name") == container:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory", "")
    return ""


def pod_findings(pods: list[dict], *, stage_of: Callable[[dict], str],
                 last_log: Callable[[str, str], str]) -> list[Finding]:
    """What the application's pods report wrong, one finding per stage, reason and message (pods of a pool that
    fail alike are counted, not repeated). `last_log(pod, container)` reads a crashing container's previous run."""
    found: dict[Finding, int] = {}
    for pod in pods:
        stage, status = stage_of(pod), pod.get("status") or {}
        items: list[Finding] = []
        if status.get("phase") == "Failed":
            items.append(Finding(stage, status.get("reason") or "Failed", _short(status.get("message") or "failed")))
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if scheduled and scheduled.get("status") == "False":
            items.append(Finding(stage, scheduled.get("reason") or "Unschedulable",
                                 _short(scheduled.get("message") or "the scheduler cannot place it")))
        for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
            for c in status.get(key) or []:
                items += _container_findings(stage, pod, c, init=init, last_log=last_log)
        for f in items:  # pods of a pool failing alike are one finding, counted
            found[f] = found.get(f, 0) + 1
    return [Finding(f.stage, f.reason, f.message, f.fatal, pods=count) for f, count in found.items()]


def serve_stage(deployment_name: str) -> str:
    """The stage a Serve deployment of the PD application serves: `Prefill:<model>`, `Decode:<model>`, else the
    ingress."""
    head = deployment_name.split(":", 1)[0].lower()
    return head if head in ("prefill", "decode") else "ingress"


def serve_findings(app: dict, *, cluster_complete: bool) -> list[Finding]:
    """What Serve says of each deployment of the application that does not run: a failed start (its cause), replicas
    failing their health checks, or replicas it cannot place (Ray's message): hopeless once every node the Ray
    cluster will have is up (`cluster_complete`), since then no node that could take them will come."""
    deployments = app.get("deployments") or app.get("serveDeploymentStatuses") or {}
    found = []
    for name, status in deployments.items():
        message = status.get("message") or ""
        stage = serve_stage(name)
        if status.get("status") in (SERVE_FAILED, SERVE_UNHEALTHY) and message:
            failed = status["status"] == SERVE_FAILED
            found.append(Finding(stage, "ReplicaStartFailed" if failed else "ReplicaUnhealthy",
                                 _short(f"{name}: {failure_cause(message)}"), fatal=failed))
        elif match := PLACEMENT.search(message):
            why = ("; every node of the Ray cluster is up and none can take them, so they never will be" if
                   cluster_complete else "")
            found.append(Finding(stage, "PlacementInfeasible" if cluster_complete else "PlacementPending",
                                 _short(f"Ray has not placed {match['count']} {name} replica(s) for over 30 s: each "
                                        f"asks for the bundles {match['required']}{why}"), fatal=cluster_complete))
    return found
