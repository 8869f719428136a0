"""Ray's part of placement, for the test stand-ins (the KubeRay stand-in, emulated clusters): what Ray 2.60, Ray Serve
LLM and KubeRay do, written from their source and never from Tandem's. This module does not import
deployments.placement, so the two can disagree and a test comparing them means something;
tests/deployments/test_placement_ray.py checks each rule here against Ray's own code in the runtime venv.

- `accelerator_type(gpu_name)`: the label Ray gives a node from its first GPU's NVML name;
- `replica_bundles(stage_config)`: the placement group Ray Serve asks for each replica of a PD stage;
- `pod_resources(worker_group, gpu_name=...)`: what a Ray worker pod of a RayCluster worker group advertises;
- `place(bundles, strategy, nodes)`: where a replica's bundles go on nodes with those free resources, or None;
- `pending_allocation_message(...)`: Serve's status message for replicas that wait for resources, in Ray's words.
"""
import json
import math
import re

from kubernetes.utils.quantity import parse_quantity

# ray/_private/accelerators/nvidia_gpu.py (Ray 2.60): NVIDIA_GPU_NAME_PATTERN and _gpu_name_to_accelerator_type.
NVIDIA_GPU_NAME_PATTERN = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
# ray/_private/ray_constants.py RESOURCE_CONSTRAINT_PREFIX; ray/llm/.../accelerators.py format_ray_accelerator_resource
ACCELERATOR_PREFIX = "accelerator_type:"
# ray/serve/_private/deployment_state.py SLOW_STARTUP_WARNING_S (its default: RAY_SERVE_SLOW_STARTUP_WARNING_S unset)
SLOW_STARTUP_WARNING_S = 30
_EPSILON = 1e-9  # Ray counts resources in 1/10000 units; sums of 0.001 must not fail on float rounding


def accelerator_type(gpu_name: str | None) -> str | None:
    """NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type: the node's accelerator_type from its GPU's name."""
    if gpu_name is None:
        return None
    match = NVIDIA_GPU_NAME_PATTERN.match(gpu_name)
    result = match.group(1).replace(" ", "-") if match else None
    if result and len(result) > 1:
        return result
    cleaned = re.sub(r"^NVIDIA\s+", "", gpu_name).strip()
    return cleaned.replace(" ", "-") if cleaned else None


def engine_bundles(stage_config: dict) -> tuple[list[dict], str]:
    """VLLMEngineConfig.placement_bundles and .placement_strategy (ray/llm/_internal/serve/engines/vllm/vllm_models.py)
    for an LLMConfig dict: explicit bundles, or bundle_per_worker for each device, each with
    `accelerator_type:<type>: 0.001` set by setdefault; without a placement_group_config, the accelerator's defaults."""
    accelerator = stage_config.get("accelerator_type")
    group = stage_config.get("placement_group_config") or {}
    engine = stage_config.get("engine_kwargs") or {}
    devices = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    if group:
        per_worker = group.get("bundle_per_worker")
        bundles = [dict(per_worker) for _ in range(devices)] if per_worker is not None \
            else [dict(b) for b in group.get("bundles") or []]
        for bundle in bundles:
            if accelerator:
                bundle.setdefault(ACCELERATOR_PREFIX + accelerator, 0.001)
        return bundles, group.get("strategy", "PACK")
    if (stage_config.get("accelerator_config") or {}).get("kind") == "cpu":
        return [{"CPU": 1} for _ in range(devices)], "PACK"
    bundle = {"GPU": 1} | ({ACCELERATOR_PREFIX + accelerator: 0.001} if accelerator else {})
    return [dict(bundle) for _ in range(devices)], "PACK"


def replica_bundles(stage_config: dict) -> tuple[list[dict], str]:
    """The placement group Serve creates for each replica (LLMServer.get_deployment_options, core/server/
    llm_server.py): the engine's bundles with the replica actor's own resources added to the first one
    (`_merge_replica_actor_and_child_actor_bundles`), and the engine's strategy."""
    bundles, strategy = engine_bundles(stage_config)
    options = (stage_config.get("deployment_config") or {}).get("ray_actor_options") or {}
    replica = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0), **options.get("resources", {})}
    if "memory" in options:
        replica["memory"] = options["memory"]
    if not bundles:
        return [replica], strategy
    first = {key: bundles[0].get(key, 0) + replica.get(key, 0) for key in set(bundles[0]) | set(replica)}
    return [first, *bundles[1:]], strategy


def _is_gpu_key(key: str) -> bool:
    # kuberay ray-operator/controllers/ray/utils: IsGPUResourceKey ("…gpu", or an NVIDIA MIG profile)
    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


def pod_resources(worker_group: dict, *, gpu_name: str | None) -> dict[str, float]:
    """What a Ray worker pod of `worker_group` (a RayCluster's workerGroupSpecs item) advertises to Ray on a node
    whose GPUs NVML names `gpu_name`. KubeRay 1.5 builds `ray start` from the Ray container (kuberay
    ray-operator/controllers/ray/common/pod.go): the group's `resources` first (cpu, memory, *gpu keys, the rest as
    custom resources: updateRayStartParamsResources), then what rayStartParams leaves unset from the container's
    limits (num-cpus from the CPU limit, else the request; memory from the memory limit; num-gpus from the first GPU
    key: generateRayStartCommand, addWellKnownAcceleratorResources). Ray then adds `accelerator_type:<type>: 1` for
    the GPU it finds (ray/_private/resource_and_label_spec.py)."""
    params = dict(worker_group.get("rayStartParams") or {})
    custom = json.loads(params["resources"].strip("'\"` ")) if "resources" in params else {}
    group_custom = {}
    for name, quantity in (worker_group.get("resources") or {}).items():
        value = parse_quantity(quantity)
        key = name.lower()
        if key == "cpu":
            params["num-cpus"] = math.ceil(value)
        elif key == "memory":
            params["memory"] = math.ceil(value)
        elif _is_gpu_key(key):
            params["num-gpus"] = math.ceil(value)
        else:
            group_custom[name] = float(value)
    custom = group_custom or custom  # the group's custom resources replace rayStartParams' `resources`
    container = worker_group["template"]["spec"]["containers"][0]
    limits = container.get("resources", {}).get("limits", {})
    requests = container.get("resources", {}).get("requests", {})
    if "num-cpus" not in params and (cpu := limits.get("cpu") or requests.get("cpu")):
        params["num-cpus"] = math.ceil(parse_quantity(cpu))
    if "memory" not in params and limits.get("memory"):
        params["memory"] = math.ceil(parse_quantity(limits["memory"]))
    if "num-gpus" not in params:
        gpu_keys = [k for k in sorted(limits) if _is_gpu_key(k) and parse_quantity(limits[k])]
        if gpu_keys:
            params["num-gpus"] = math.ceil(parse_quantity(limits[gpu_keys[0]]))
    resources = {"CPU": float(params.get("num-cpus", 0)), "GPU": float(params.get("num-gpus", 0)),
                 "memory": float(params.get("memory", 0)), **custom}
    if resources["GPU"] and (label := accelerator_type(gpu_name)):
        resources[ACCELERATOR_PREFIX + label] = 1.0
    return {k: v for k, v in resources.items() if v}


def _fits(need: dict, free: dict) -> bool:
    return all(amount <= free.get(key, 0) + _EPSILON for key, amount in need.items() if amount > 0)


def _take(need: dict, free: dict) -> None:
    for key, amount in need.items():
        free[key] = free.get(key, 0) - amount


def place(bundles: list[dict], strategy: str, nodes: list[dict]) -> list[int] | None:
    """The node (an index into `nodes`, each a dict of free resources) each bundle of one placement group goes to,
    or None where Ray cannot place the group: STRICT_PACK needs one node holding all, STRICT_SPREAD a node of its
    own for each bundle, PACK and SPREAD any nodes that hold them."""
    free = [dict(n) for n in nodes]
    if strategy == "STRICT_PACK":
        need: dict[str, float] = {}
        for bundle in bundles:
            for key, amount in bundle.items():
                need[key] = need.get(key, 0) + amount
        node = next((i for i, f in enumerate(free) if _fits(need, f)), None)
        return None if node is None else [node] * len(bundles)
    chosen: list[int] = []
    for bundle in bundles:
        candidates = [i for i, f in enumerate(free) if _fits(bundle, f)
                      and not (strategy == "STRICT_SPREAD" and i in chosen)]
        if not candidates:
            return None
        # PACK prefers a node already used, SPREAD one not yet used; either takes another when it must.
        used = [i for i in candidates if i in chosen]
        unused = [i for i in candidates if i not in chosen]
        node = (used or unused)[0] if strategy == "PACK" else (unused or used)[0]
        _take(bundle, free[node])
        chosen.append(node)
    return chosen


def pending_allocation_message(*, deployment: str, app: str, replicas: int, required: list[dict] | dict,
                               available: dict) -> str:
    """Serve's status message for a deployment whose replicas wait for resources longer than the slow-start warning
    (ray/serve/_private/deployment_state.py `_check_and_update_transitioning_replicas` and `resource_requirements`).
    `required` is the replica's placement group bundles (or its actor's resources), amounts Serve holds as floats;
    `available` the cluster's available resources, of which Serve keeps only the keys `required` names: none when
    it is a list of bundles (recorded in local/examples/applications-unplaced-replica.json)."""
    if isinstance(required, list):
        required = [{k: float(v) for k, v in bundle.items()} for bundle in required]
    kept = {k: v for k, v in available.items() if k in required}
    return (f"Deployment '{deployment}' in application '{app}' has {replicas} replicas that have taken more than "
            f"{SLOW_STARTUP_WARNING_S}s to be scheduled. This may be due to waiting for the cluster to auto-scale or "
            "for a runtime environment to be installed. "
            f"Resources required for each replica: {json.dumps(required)}, total resources available: "
            f"{json.dumps(kept)}. Use `ray status` for more details.")
