"""The deployment spec: parsed and validated from user input into frozen data, in one pure function.

Every error names the field and says what to do, so the API can return it as a field-level 400.
"""
import re
from dataclasses import asdict, dataclass, field

from deployments.catalog import INSTANCE_TYPES, KNOWN_BROKEN, RUNTIMES, runtime_choices_text

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40  # leaves room for the suffixes KubeRay adds to a RayService name (63 in all)
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
LOCAL_PATH = re.compile(r"^/[^\x00\s]{0,1023}$")
DTYPES = ("auto", "bfloat16", "float16")
KV_CONNECTORS = ("NixlConnector",)


class SpecError(Exception):
    """A spec that cannot run; `errors` maps a dotted field path to messages a user can act on."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class PoolSpec:
    instance_type: str
    nodes: int
    gpus_per_node: int
    tensor_parallel_size: int
    replicas_min: int
    replicas_max: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class EngineSpec:
    max_model_len: int = 8192
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.9
    kv_connector: str = "NixlConnector"


@dataclass(frozen=True)
class LoadSpec:
    requests_per_second: float = 1.0
    mean_prompt_tokens: int = 1024
    mean_output_tokens: int = 256


@dataclass(frozen=True)
class DeploymentSpec:
    model_id: str
    model_source: str
    runtime: str
    prefill: PoolSpec
    decode: PoolSpec
    engine: EngineSpec = field(default_factory=EngineSpec)
    expected_load: LoadSpec = field(default_factory=LoadSpec)

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    def to_dict(self) -> dict:
        return asdict(self)


def spec_as_input(stored: dict) -> dict:
    """A stored spec back into the request shape spec_parse reads (to re-check it against today's catalog)."""
    return {
        "model": {"id": stored["model_id"], "source": stored["model_source"]},
        "runtime": stored["runtime"],
        "prefill": stored["prefill"],
        "decode": stored["decode"],
        "engine": stored["engine"],
        "expected_load": stored["expected_load"],
    }


def spec_gpus(data: dict) -> int:
    """GPUs a stored (already validated) spec holds: nodes × GPUs per node over both pools."""
    return sum(data[p]["nodes"] * data[p]["gpus_per_node"] for p in ("prefill", "decode"))


class _Collector:
    def __init__(self):
        self.errors: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def int_in(self, data: dict, key: str, path: str, lo: int, hi: int, default=None):
        value = data.get(key, default)
        if value is None:
            self.add(path, "This field is required.")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"Must be a whole number, got {value!r}.")
            return None
        if not lo <= value <= hi:
            self.add(path, f"Must be between {lo} and {hi}, got {value}.")
            return None
        return value

    def number_in(self, data: dict, key: str, path: str, lo: float, hi: float, default):
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.add(path, f"Must be a number, got {value!r}.")
            return None
        if not lo <= value <= hi:
            self.add(path, f"Must be between {lo} and {hi}, got {value}.")
            return None
        return float(value)

    def choice(self, data: dict, key: str, path: str, choices, default):
        value = data.get(key, default)
        if value not in choices:
            self.add(path, f"Must be one of {', '.join(map(str, choices))}; got {value!r}.")
            return None
        return value


def name_errors(name) -> list[str]:
    """Why a deployment name is not a usable DNS-1123 label (empty when it is)."""
    if not isinstance(name, str) or not name:
        return ["A name is required: lowercase letters, digits and '-'."]
    problems = []
    if len(name) > NAME_MAX:
        problems.append(f"At most {NAME_MAX} characters (Kubernetes adds suffixes to it); got {len(name)}.")
    if not DNS1123_LABEL.match(name):
        problems.append(
            "Use only lowercase letters, digits and '-', starting and ending with a letter or digit "
            f"(a DNS-1123 label); got {name!r}."
        )
    return problems


def _pool(c: _Collector, data, prefix: str, accelerator: str) -> PoolSpec | None:
    if not isinstance(data, dict):
        c.add(prefix, "Give the pool as an object with instance_type, nodes, gpus_per_node, tensor_parallel_size.")
        return None
    itype = data.get("instance_type")
    instance = INSTANCE_TYPES.get(itype) if isinstance(itype, str) else None
    if instance is None:
        known = ", ".join(sorted(INSTANCE_TYPES))
        c.add(f"{prefix}.instance_type", f"Unknown instance type {itype!r}; known types: {known}.")
        return None
    if accelerator == "cpu" and instance.gpus:
        c.add(f"{prefix}.instance_type", "The CPU runtime runs only on the 'cpu' instance type.")
        return None
    if accelerator == "gpu" and not instance.gpus:
        c.add(f"{prefix}.instance_type", f"{itype} has no GPU; pick a GPU instance type for this runtime.")
        return None
    nodes = c.int_in(data, "nodes", f"{prefix}.nodes", 1, 64, default=1)
    max_gpus = instance.gpus
    gpus = c.int_in(data, "gpus_per_node", f"{prefix}.gpus_per_node", 0 if not max_gpus else 1, max_gpus, max_gpus)
    tp = c.int_in(data, "tensor_parallel_size", f"{prefix}.tensor_parallel_size", 1, 64, default=max(gpus or 1, 1))
    rmin = c.int_in(data, "replicas_min", f"{prefix}.replicas_min", 1, 256, default=1)
    rmax = c.int_in(data, "replicas_max", f"{prefix}.replicas_max", 1, 256, default=rmin or 1)
    if None in (nodes, gpus, tp, rmin, rmax):
        return None
    ok = True
    if max_gpus and gpus % tp:
        c.add(f"{prefix}.tensor_parallel_size",
              f"Tensor-parallel size {tp} does not divide the {gpus} GPUs per node; use a divisor of {gpus}.")
        ok = False
    if not max_gpus and tp != 1:
        c.add(f"{prefix}.tensor_parallel_size", "Must be 1 on the CPU runtime.")
        ok = False
    if rmin > rmax:
        c.add(f"{prefix}.replicas_min", f"replicas_min ({rmin}) is above replicas_max ({rmax}).")
        ok = False
    if max_gpus and ok and rmax * tp > nodes * gpus:
        c.add(f"{prefix}.replicas_max",
              f"{rmax} replicas × {tp} GPUs each need {rmax * tp} GPUs, but the pool has "
              f"{nodes} node(s) × {gpus} GPUs = {nodes * gpus}.")
        ok = False
    return PoolSpec(itype, nodes, gpus, tp, rmin, rmax) if ok else None


def _runtime(c: _Collector, data, target_kind: str | None, accelerator_hint: str | None = None):
    """The supported runtime a request names (by key, or by Ray and vLLM versions), checked against the
    known-broken pairs; KNOWN_BROKEN is about vLLM's CUDA builds, so a CPU runtime is never refused by it."""
    key = data
    if isinstance(data, dict):
        ray, vllm = data.get("ray"), data.get("vllm")
        accelerator = data.get("accelerator") or accelerator_hint
        matches = [r for r in RUNTIMES.values() if r.ray == ray and r.vllm == vllm
                   and (not accelerator or r.accelerator == accelerator)]
        if not matches and (ray, vllm) not in KNOWN_BROKEN:
            c.add("runtime", f"Ray {ray} with vLLM {vllm} is not a supported combination. "
                             f"Supported: {runtime_choices_text()}.")
            return None
        key = matches[0].key if matches else None
        if key is None:
            c.add("runtime", f"Ray {ray} with vLLM {vllm} is known not to work: {KNOWN_BROKEN[(ray, vllm)]} "
                             f"Supported: {runtime_choices_text()}.")
            return None
    runtime = RUNTIMES.get(key) if isinstance(key, str) else None
    if runtime is None:
        c.add("runtime", f"Unknown runtime {key!r}. Supported: {runtime_choices_text()}.")
        return None
    broken = KNOWN_BROKEN.get((runtime.ray, runtime.vllm)) if runtime.accelerator == "gpu" else None
    if broken:
        c.add("runtime", f"Runtime {runtime.key} is known not to work: {broken} Supported: {runtime_choices_text()}.")
        return None
    if target_kind and target_kind not in runtime.target_kinds:
        c.add("runtime", f"Runtime {runtime.key} cannot run on a {target_kind} cluster "
                         f"(it runs on: {', '.join(runtime.target_kinds)}).")
        return None
    return runtime


def _model(c: _Collector, data, target_kind: str | None):
    if not isinstance(data, dict):
        c.add("model", "Give the model as an object: {\"id\": ..., \"source\": ...}.")
        return None, None
    model_id, source = data.get("id"), data.get("source")
    if not isinstance(model_id, str) or not MODEL_ID.match(model_id):
        c.add("model.id", "The name clients pass as `model`: 1-128 letters, digits, '.', '_', ':', '/' or '-'.")
        model_id = None
    if not isinstance(source, str) or not (S3_URI.match(source) or HF_REPO.match(source) or LOCAL_PATH.match(source)):
        c.add("model.source", "Give an s3://bucket/prefix URI, a Hugging Face repo id (org/name), or an "
                              "absolute path on the cluster's nodes.")
        source = None
    elif LOCAL_PATH.match(source) and target_kind in ("eks", "kubernetes"):
        c.add("model.source", "A local path only works on a `ray` cluster; on Kubernetes use s3:// or a "
                              "Hugging Face repo id.")
        source = None
    return model_id, source


def spec_parse(data, *, target_kind: str | None = None) -> DeploymentSpec:
    """Validate raw input (the API's `spec` object) into a DeploymentSpec, or raise SpecError."""
    c = _Collector()
    if not isinstance(data, dict):
        raise SpecError({"spec": ["Must be an object."]})
    prefill_in = data.get("prefill") if isinstance(data.get("prefill"), dict) else {}
    instance = INSTANCE_TYPES.get(prefill_in.get("instance_type")) if isinstance(prefill_in.get("instance_type"), str) else None
    hint = None if instance is None else ("gpu" if instance.gpus else "cpu")
    runtime = _runtime(c, data.get("runtime"), target_kind, hint)
    model_id, source = _model(c, data.get("model"), target_kind)
    accelerator = runtime.accelerator if runtime else "gpu"
    prefill = _pool(c, data.get("prefill"), "prefill", accelerator)
    decode = _pool(c, data.get("decode"), "decode", accelerator)

    engine_in = data.get("engine") or {}
    if not isinstance(engine_in, dict):
        c.add("engine", "Must be an object.")
        engine_in = {}
    defaults = EngineSpec()
    engine = EngineSpec(
        max_model_len=c.int_in(engine_in, "max_model_len", "engine.max_model_len", 16, 1_048_576,
                               defaults.max_model_len),
        dtype=c.choice(engine_in, "dtype", "engine.dtype", DTYPES, defaults.dtype),
        gpu_memory_utilization=c.number_in(engine_in, "gpu_memory_utilization",
                                           "engine.gpu_memory_utilization", 0.1, 0.98,
                                           defaults.gpu_memory_utilization),
        kv_connector=c.choice(engine_in, "kv_connector", "engine.kv_connector", KV_CONNECTORS,
                              defaults.kv_connector),
    )
    load_in = data.get("expected_load") or {}
    if not isinstance(load_in, dict):
        c.add("expected_load", "Must be an object.")
        load_in = {}
    ld = LoadSpec()
    load = LoadSpec(
        requests_per_second=c.number_in(load_in, "requests_per_second", "expected_load.requests_per_second",
                                        0, 100_000, ld.requests_per_second),
        mean_prompt_tokens=c.int_in(load_in, "mean_prompt_tokens", "expected_load.mean_prompt_tokens", 1,
                                    1_048_576, ld.mean_prompt_tokens),
        mean_output_tokens=c.int_in(load_in, "mean_output_tokens", "expected_load.mean_output_tokens", 1,
                                    1_048_576, ld.mean_output_tokens),
    )
    if engine.max_model_len and load.mean_prompt_tokens and load.mean_prompt_tokens > engine.max_model_len:
        c.add("expected_load.mean_prompt_tokens",
              f"Longer than engine.max_model_len ({engine.max_model_len}); raise max_model_len or shorten prompts.")
    if c.errors:
        raise SpecError(c.errors)
    return DeploymentSpec(model_id, source, runtime.key, prefill, decode, engine, load)
