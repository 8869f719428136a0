"""What the cluster reports, read into findings: one case per kind of report, in the words Kubernetes and Ray use
(container states as the kubelet writes them into a pod's status; Serve's deployment messages as Ray 2.60 words
them, ray/serve/_private/deployment_state.py), and which of them can never heal."""
import pytest

from workers.diagnosis import Finding, findings_text, pod_findings, serve_findings

NOT_FOUND = ('rpc error: code = NotFound desc = failed to pull and unpack image "reg/ray:x": failed to resolve '
             'reference "reg/ray:x": reg/ray:x: not found')
TOO_MANY = ('rpc error: code = Unknown desc = failed to pull and unpack image "reg/ray:x": failed to copy: httpReadSeeker:'
            ' failed open: unexpected status code https://reg/v2/ray/manifests/x: 429 Too Many Requests - Server '
            'message: toomanyrequests: Rate exceeded')


def _pod(name="p-0", pool="decode", *, containers=(), init=(), phase="Running", conditions=(), **status):
    return {"metadata": {"name": name, "labels": {"tandem.dev/pool": pool}},
            "spec": {"containers": [{"name": "ray-worker", "resources": {"limits": {"memory": "180Gi"}}}]},
            "status": {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers),
                       "initContainerStatuses": list(init), **status}}


def _c(state: dict, *, last: dict | None = None, ready=False, restarts=0, image="reg/ray:x", name="ray-worker"):
    return {"name": name, "image": image, "ready": ready, "restartCount": restarts, "state": state,
            "lastState": last or {}}


def _findings(*pods, logs=None):
    return pod_findings(list(pods), stage_of=lambda p: p["metadata"]["labels"]["tandem.dev/pool"],
                        last_log=lambda pod, container: (logs or {}).get((pod, container), ""))


@pytest.mark.parametrize(("pod", "expected"), [
    # starting normally: nothing to say
    (_pod(containers=[_c({"waiting": {"reason": "ContainerCreating"}})]), []),
    (_pod(containers=[_c({"running": {}}, ready=True)]), []),
    (_pod(init=[_c({"terminated": {"exitCode": 0, "reason": "Completed"}}, name="wait-gcs-ready")],
          containers=[_c({"running": {}}, ready=True)]), []),
    # an image that does not exist can never be pulled; a registry that throttles can
    (_pod(phase="Pending", containers=[_c({"waiting": {"reason": "ImagePullBackOff",
                                                       "message": f'Back-off pulling image "reg/ray:x": {NOT_FOUND}'}})]),
     [Finding("decode", "ImagePullBackOff", f'container ray-worker cannot pull reg/ray:x: Back-off pulling image '
                                            f'"reg/ray:x": {NOT_FOUND}', fatal=True)]),
    (_pod(phase="Pending", containers=[_c({"waiting": {"reason": "ErrImagePull", "message": TOO_MANY}})]),
     [Finding("decode", "ErrImagePull", f"container ray-worker cannot pull reg/ray:x: {TOO_MANY}")]),
    # killed for memory before it was ever ready: fatal, with its limit
    (_pod(containers=[_c({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
                         last={"terminated": {"reason": "OOMKilled", "exitCode": 137}}, restarts=2)]),
     [Finding("decode", "OOMKilled", "container ray-worker was killed for running out of memory (exit code 137) "
                                     "before it was ever ready; its memory limit is 180Gi. It needs more memory "
                                     "than the pool's nodes give it.", fatal=True)]),
    # a crash loop may heal (the deadline decides); its last lines are shown
    (_pod(containers=[_c({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                         last={"terminated": {"reason": "Error", "exitCode": 1}}, restarts=3)]),
     [Finding("decode", "CrashLoopBackOff", "container ray-worker keeps crashing, restarted 3 times (last exit: "
                                            "Error 1); its last log lines: b | c | RuntimeError: boom")]),
    # what nobody named, in the kubelet's own words
    (_pod(init=[_c({"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}},
                   name="wait-gcs-ready")]),
     [Finding("decode", "CreateContainerConfigError", 'init container wait-gcs-ready: secret "s" not found')]),
    (_pod(phase="Failed", reason="Evicted", message="The node was low on resource: ephemeral-storage."),
     [Finding("decode", "Evicted", "The node was low on resource: ephemeral-storage.")]),
    (_pod(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]),
     [Finding("decode", "Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]),
    (_pod(containers=[_c({"terminated": {"exitCode": 2, "reason": "Error", "message": "bad flag"}})]),
     [Finding("decode", "Error", "container ray-worker exited with code 2: bad flag")]),
])
def test_each_report_becomes_one_finding_in_its_reporters_words(pod, expected):
    logs = {("p-0", "ray-worker"): "a\nb\nc\nRuntimeError: boom\n"}
    assert _findings(pod, logs=logs) == expected


def test_pods_of_a_pool_that_fail_alike_are_one_finding_counted():
    pulling = _c({"waiting": {"reason": "ImagePullBackOff", "message": NOT_FOUND}})
    found = _findings(_pod("p-0", containers=[pulling]), _pod("p-1", containers=[pulling]),
                      _pod("h-0", "head", containers=[pulling]))
    assert [(f.stage, f.pods) for f in found] == [("decode", 2), ("head", 1)]
    assert findings_text(found).splitlines()[0].startswith("decode (2 pods): ImagePullBackOff: ")


def _serve(status: str, message: str) -> dict:
    return {"status": "DEPLOYING", "deployments": {"Prefill:llama": {"status": status, "message": message}}}


PENDING = ("Deployment 'Prefill:llama' in application 'llama' has 1 replicas that have taken more than 30s to be "
           "scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime environment to be "
           'installed. Resources required for each replica: [{"GPU": 1.0, "prefill_pool": 1.0, '
           '"accelerator_type:A100-40G": 0.001}], total resources available: {}. Use `ray status` for more details.')


@pytest.mark.parametrize(("app", "complete", "expected"), [
    (_serve("UPDATING", "Deployment 'Prefill:llama' in application 'llama' has 1 replicas that have taken more than "
                        "30s to initialize.\nThis may be caused by a slow __init__ or reconfigure method."), True, []),
    (_serve("UPDATING", PENDING), False,
     [Finding("prefill", "PlacementPending", 'Ray has not placed 1 Prefill:llama replica(s) for over 30 s: each asks '
                                             'for the bundles [{"GPU": 1.0, "prefill_pool": 1.0, '
                                             '"accelerator_type:A100-40G": 0.001}]')]),
    (_serve("UPDATING", PENDING), True,
     [Finding("prefill", "PlacementInfeasible", 'Ray has not placed 1 Prefill:llama replica(s) for over 30 s: each '
                                                'asks for the bundles [{"GPU": 1.0, "prefill_pool": 1.0, '
                                                '"accelerator_type:A100-40G": 0.001}]; every node of the Ray cluster '
                                                'is up and none can take them, so they never will be', fatal=True)]),
    (_serve("DEPLOY_FAILED", "Traceback (most recent call last):\n  File x\nRuntimeError: engine died"), False,
     [Finding("prefill", "ReplicaStartFailed", "Prefill:llama: RuntimeError: engine died", fatal=True)]),
    (_serve("UNHEALTHY", "Traceback (most recent call last):\n  File x\nActorDiedError: gone"), False,
     [Finding("prefill", "ReplicaUnhealthy", "Prefill:llama: ActorDiedError: gone")]),
])
def test_serve_says_which_replicas_cannot_start_or_be_placed(app, complete, expected):
    assert serve_findings(app, cluster_complete=complete) == expected
