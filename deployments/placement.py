"""Ray's own placement rules for a PD deployment, applied before any GPU is bought.

Four parts, each a pure function over the catalog (the control plane runs no Ray):
- what Tandem asks for: each stage's accelerator type and placement bundles (`stage_placement`, which the serve
  config writes as they are);
- what Ray Serve LLM makes of that for each replica (`replica_ask`: Ray 2.60's own rules);
- what each pool's worker pods give Ray (`worker_amounts`, `worker_group_resources`, which the manifests write;
  `node_resources`: what KubeRay and Ray turn them into on the node);
- whether a replica's bundles fit such a node (`unplaced`, `stage_problems`, `placement_problems`; deployments.spec
  runs the last with every other rule, at request time and at each reconcile pass).
tests/deployments/test_placement_ray.py checks the label and the bundles against Ray's own code in the runtime venv
for every GPU instance type of the catalog; test_placement_ray_cluster.py tries a real Ray scheduler on a p4d node.
"""
import re
from dataclasses import dataclass

from deployments.catalog import INSTANCE_TYPES, InstanceType

# The custom resource each stage's bundles consume and only its own pool's nodes advertise, so that prefill and
# decode replicas land on their own pools.
POOL_RESOURCE = {"prefill": "prefill_pool", "decode": "decode_pool"}
# How Ray names a node's accelerator as a resource (ray._private.ray_constants.RESOURCE_CONSTRAINT_PREFIX) and the
# amount of it Ray Serve LLM adds to every bundle (vllm_models.py `placement_bundles`: setdefault(..., 0.001)).
ACCELERATOR_RESOURCE = "accelerator_type:{}"
ACCELERATOR_HINT = 0.001
STRICT_PACK = "STRICT_PACK"
# Ray 2.60, ray/_private/accelerators/nvidia_gpu.py NVIDIA_GPU_NAME_PATTERN: the run of leading all-caps tokens up
# to the first token with a digit, after the brand ("NVIDIA A100-SXM4-40GB" -> "A100", "NVIDIA H100 80GB HBM3" ->
# "H100"). The 40G/80G types Ray also knows (ray/util/accelerators/accelerators.py) "are not auto-added to nodes".
_NVIDIA_GPU_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
_GIB = 2 ** 30


def ray_accelerator_label(gpu_product: str) -> str:
    """The accelerator type Ray gives a node whose first GPU NVML names `gpu_product`: Ray 2.60's
    NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type ("" where Ray gives none)."""
    match = _NVIDIA_GPU_NAME.match(gpu_product)
    label = match.group(1).replace(" ", "-") if match else ""
    if len(label) > 1:
        return label
    # Mixed-case consumer names ("NVIDIA GeForce RTX 5090") fall back to the hyphen-joined product name.
    return re.sub(r"^NVIDIA\s+", "", gpu_product).strip().replace(" ", "-")


def accelerator_label(instance: InstanceType) -> str:
    """The accelerator type Ray detects on a node of this instance type, from its GPU's product name ("" without
    a GPU). Ray Serve LLM's bundles must ask for exactly this one, or no node of the pool takes them."""
    return ray_accelerator_label(instance.gpu_product) if instance.gpus else ""


def stage_placement(*, stage: str, instance: InstanceType, tensor_parallel_size: int) -> dict:
    """The placement keys of a stage's LLMConfig, as the serve config writes them: on GPUs the nodes' accelerator
    type and one bundle per tensor-parallel rank, all on one node of the stage's pool; on CPUs (the local target)
    one bundle of a core."""
    resource = POOL_RESOURCE[stage]
    if not instance.gpus:
        return {"accelerator_config": {"kind": "cpu"},
                "placement_group_config": {"bundles": [{"CPU": 1, resource: 1}], "strategy": "PACK"}}
    return {"accelerator_type": accelerator_label(instance),
            "placement_group_config": {"bundles": [{"GPU": 1, resource: 1} for _ in range(tensor_parallel_size)],
                                       "strategy": STRICT_PACK}}


@dataclass(frozen=True)
class ReplicaAsk:
    """What Ray Serve asks for each replica of a stage: the engine's bundles and strategy, and the replica actor's
    own resources, which Serve adds to the first bundle."""

    bundles: tuple[dict, ...]
    strategy: str
    replica: dict

    @property
    def placement_group_bundles(self) -> list[dict]:
        """The replica's placement group, bundle by bundle (Ray 2.60 llm_server.py
        `_merge_replica_actor_and_child_actor_bundles`)."""
        if not self.bundles:
            return [dict(self.replica)]
        first = self.bundles[0]
        merged = {key: first.get(key, 0) + self.replica.get(key, 0) for key in [*first, *self.replica]}
        return [merged, *(dict(b) for b in self.bundles[1:])]


def _hinted(bundle: dict, hint: dict) -> dict:
    """A bundle with the accelerator hint added where it names none (Ray's setdefault: an explicit value wins)."""
    return {**bundle, **{k: v for k, v in hint.items() if k not in bundle}}


def replica_ask(stage_config: dict) -> ReplicaAsk:
    """What Ray Serve LLM 2.60 asks for each replica of a stage, from the stage's LLMConfig (a `prefill_config` or
    `decode_config` as the serve config writes it): ray/llm/_internal/serve/engines/vllm/vllm_models.py
    VLLMEngineConfig.placement_bundles and placement_strategy, and core/server/llm_server.py
    LLMServer.get_deployment_options for the replica actor (CPU 1 unless its ray_actor_options say otherwise)."""
    accelerator = stage_config.get("accelerator_type")
    hint = {ACCELERATOR_RESOURCE.format(accelerator): ACCELERATOR_HINT} if accelerator else {}
    group = stage_config.get("placement_group_config") or {}
    engine = stage_config.get("engine_kwargs") or {}
    devices = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    if group.get("bundle_per_worker") is not None:
        bundles = [_hinted(group["bundle_per_worker"], hint) for _ in range(devices)]
    elif group:
        bundles = [_hinted(b, hint) for b in group.get("bundles") or []]
    elif (stage_config.get("accelerator_config") or {}).get("kind") == "cpu":
        bundles = [{"CPU": 1} for _ in range(devices)]
    else:
        bundles = [{"GPU": 1, **hint} for _ in range(devices)]
    options = (stage_config.get("deployment_config") or {}).get("ray_actor_options") or {}
    replica = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0), **options.get("resources", {})}
    if "memory" in options:
        replica["memory"] = options["memory"]
    return ReplicaAsk(bundles=tuple(bundles), strategy=group.get("strategy", "PACK"), replica=replica)


def _worker_sizes(instance: InstanceType, gpus_per_node: int) -> tuple[int, int, int]:
    # Leave two vCPUs and a tenth of memory to the kubelet and the daemonsets, else the pod never fits the node.
    return max(instance.vcpus - 2, 1), int(instance.memory_gib * 0.9), gpus_per_node


def worker_amounts(*, instance: InstanceType, gpus_per_node: int) -> dict[str, str]:
    """What each Ray worker pod of a pool requests and is limited to: CPUs, memory and the GPUs the pool uses."""
    cpus, memory_gib, gpus = _worker_sizes(instance, gpus_per_node)
    return {"cpu": str(cpus), "memory": f"{memory_gib}Gi", "nvidia.com/gpu": str(gpus)}


def worker_group_resources(*, stage: str, gpus_per_node: int) -> dict[str, str]:
    """The worker group's `resources`, which KubeRay passes to `ray start --resources`: one unit of the stage's pool
    resource per GPU of the node."""
    return {POOL_RESOURCE[stage]: str(max(gpus_per_node, 1))}


def node_resources(*, stage: str, instance: InstanceType, gpus_per_node: int) -> dict[str, float]:
    """What one node of a pool advertises to Ray on Kubernetes. KubeRay starts Ray with num-gpus from the container's
    nvidia.com/gpu limit, num-cpus and memory from its CPU and memory limits, and the worker group's `resources` as
    custom resources (kuberay ray-operator/controllers/ray/common/pod.go: generateRayStartCommand,
    updateRayStartParamsResources); Ray adds `accelerator_type:<label>: 1` for the GPU it finds
    (ray/_private/resource_and_label_spec.py `_resolve_accelerator_resources`)."""
    cpus, memory_gib, gpus = _worker_sizes(instance, gpus_per_node)
    node = {"GPU": gpus} if gpus else {}
    node |= {k: float(v) for k, v in worker_group_resources(stage=stage, gpus_per_node=gpus_per_node).items()}
    if label := accelerator_label(instance):
        node[ACCELERATOR_RESOURCE.format(label)] = 1
    return node | {"CPU": cpus, "memory": memory_gib * _GIB}


def _value(key: str, value: float) -> str:
    return f"{value / _GIB:g}Gi" if key == "memory" else f"{value:g}"  # Ray counts memory in bytes


def _resources_text(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {_value(k, v)}" for k, v in resources.items()) + "}"


def unplaced(ask: ReplicaAsk, node: dict[str, float]) -> list[str]:
    """Why a replica's bundles do not fit nodes like `node` (empty when they do). STRICT_PACK puts every bundle on
    one node, so their sum must fit it; under another strategy each bundle must at least fit a node."""
    bundles = ask.placement_group_bundles
    groups = [bundles] if ask.strategy == STRICT_PACK else [[b] for b in bundles]
    problems = []
    for group in groups:
        need: dict[str, float] = {}
        for bundle in group:
            for key, amount in bundle.items():
                need[key] = need.get(key, 0) + amount
        for key, amount in need.items():
            have = node.get(key, 0)
            if amount <= 0 or have >= amount - 1e-9:
                continue
            problem = f"it has no {key}" if not have else \
                f"it has {_value(key, have)} {key} and the replica needs {_value(key, amount)}"
            if problem not in problems:
                problems.append(problem)
    return problems


def _ask_text(ask: ReplicaAsk) -> str:
    """The bundles as a user reads them: identical ones counted, the replica actor's own share named."""
    n = len(ask.bundles)
    if n and all(b == ask.bundles[0] for b in ask.bundles):
        text = f"{n} bundle{'s' if n > 1 else ''} of {_resources_text(ask.bundles[0])}"
    else:
        text = f"the bundles {', '.join(map(_resources_text, ask.bundles))}"
    own = {k: v for k, v in ask.replica.items() if v}
    if own:
        text += f"{', the first' if n > 1 else ''} with the replica's own {_resources_text(own)[1:-1]}"
    where = "on one node" if ask.strategy == STRICT_PACK else "each on a node"
    return f"{text}, {where} ({ask.strategy})"


def stage_problems(*, stage: str, instance: InstanceType, gpus_per_node: int, stage_config: dict) -> list[str]:
    """Why the replicas of a stage whose LLMConfig is `stage_config` cannot be placed on the nodes of its pool (worker
    pods of `instance` using `gpus_per_node` GPUs), in the user's words with the bundles and the node side by side;
    empty when they can."""
    ask = replica_ask(stage_config)
    node = node_resources(stage=stage, instance=instance, gpus_per_node=gpus_per_node)
    problems = unplaced(ask, node)
    if not problems:
        return []
    return [f"Ray Serve LLM asks each {stage} replica for {_ask_text(ask)}; a {instance.name} node of this pool "
            f"advertises {_resources_text(node)}: {'; '.join(problems)}."]


def placement_problems(*, stage: str, instance_type: str, gpus_per_node: int, tensor_parallel_size: int,
                       target_kind: str | None) -> list[str]:
    """stage_problems for what the serve config writes for a pool of the spec. Judged where Tandem makes the nodes:
    worker pods on `kubernetes` and `eks`, and a plan without a cluster as if there. A `ray` cluster's nodes are
    whatever its operator started, which nothing here knows, so it is not judged here."""
    instance = INSTANCE_TYPES[instance_type]
    if target_kind == "ray" or not instance.gpus:
        return []
    config = stage_placement(stage=stage, instance=instance, tensor_parallel_size=tensor_parallel_size)
    return stage_problems(stage=stage, instance=instance, gpus_per_node=gpus_per_node, stage_config=config)
