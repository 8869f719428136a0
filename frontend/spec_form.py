"""The request form as data: flat HTML field names ↔ the spec's dotted paths, defaults, and conversions.

Validation itself stays in `deployments.spec.spec_parse` (one place for every rule); this module only turns
form strings into the request-shaped spec, maps `SpecError` paths back onto fields, and back again for edits.
"""
from dataclasses import dataclass, is_dataclass

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.spec import DTYPES, KV_CONNECTORS, DeploymentSpec, EngineSpec, LoadSpec

POOLS = ("prefill", "decode")


@dataclass(frozen=True)
class Field:
    name: str  # the HTML field name
    path: str  # dotted path inside the request-shaped spec ("" for fields outside the spec)
    label: str
    kind: str = "text"  # text | int | float | select
    help: str = ""
    step: str = ""


def _pool_fields(pool: str) -> list[Field]:
    p = pool
    return [
        Field(f"{p}_instance_type", f"{p}.instance_type", "Instance type", "select"),
        Field(f"{p}_nodes", f"{p}.nodes", "Nodes", "int"),
        Field(f"{p}_gpus_per_node", f"{p}.gpus_per_node", "GPUs per node", "int",
              "Defaults to all of the instance's GPUs."),
        Field(f"{p}_tensor_parallel_size", f"{p}.tensor_parallel_size", "Tensor parallel size", "int",
              "Must divide GPUs per node."),
        Field(f"{p}_replicas_min", f"{p}.replicas_min", "Replicas (min)", "int"),
        Field(f"{p}_replicas_max", f"{p}.replicas_max", "Replicas (max)", "int"),
    ]


MODEL_FIELDS = [
    Field("model_id", "model.id", "Model name", help="What clients pass as `model`, e.g. llama-3-8b."),
    Field("model_source", "model.source", "Weights",
          help="s3://bucket/prefix, a Hugging Face repo id (org/name), or an absolute path on a Ray cluster."),
    Field("runtime", "runtime", "Runtime", "select", help="Ray, vLLM and NIXL versions that work together."),
]
POOL_FIELDS = {p: _pool_fields(p) for p in POOLS}
ENGINE_FIELDS = [
    Field("engine_max_model_len", "engine.max_model_len", "Max context (tokens)", "int"),
    Field("engine_dtype", "engine.dtype", "Weights dtype", "select"),
    Field("engine_gpu_memory_utilization", "engine.gpu_memory_utilization", "GPU memory utilization", "float",
          "Share of each GPU's memory vLLM may use (0.1–0.98).", step="0.01"),
    Field("engine_kv_connector", "engine.kv_connector", "KV connector", "select",
          "Moves KV from prefill to decode."),
]
LOAD_FIELDS = [
    Field("load_requests_per_second", "expected_load.requests_per_second", "Requests per second", "float",
          step="0.1"),
    Field("load_mean_prompt_tokens", "expected_load.mean_prompt_tokens", "Mean prompt tokens", "int"),
    Field("load_mean_output_tokens", "expected_load.mean_output_tokens", "Mean output tokens", "int"),
]
TARGET_FIELDS = [  # optional: all blank means no targets
    Field("targets_ttft_p95_ms", "targets.ttft_p95_ms", "TTFT p95 target (ms)", "float",
          "Time to first token at the gateway.", step="any"),
    Field("targets_itl_p95_ms", "targets.itl_p95_ms", "ITL p95 target (ms)", "float",
          "Mean gap between tokens of a request.", step="any"),
    Field("targets_share", "targets.share", "Share of requests that must meet them", "float",
          "0.95 means 95%.", step="0.01"),
]
# Optional config.json facts for the planner; not part of the spec.
FACT_FIELDS = [
    Field("fact_num_hidden_layers", "num_hidden_layers", "Layers", "int"),
    Field("fact_hidden_size", "hidden_size", "Hidden size", "int"),
    Field("fact_num_attention_heads", "num_attention_heads", "Attention heads", "int"),
    Field("fact_num_key_value_heads", "num_key_value_heads", "KV heads", "int"),
    Field("fact_head_dim", "head_dim", "Head dim", "int"),
    Field("fact_param_count", "param_count", "Parameters", "int", "Total count, e.g. 8030261248."),
    Field("fact_vocab_size", "vocab_size", "Vocabulary", "int",
          "vocab_size: keeps the embedding table out of the expected prefill and decode times."),
]
SPEC_FIELDS = MODEL_FIELDS + POOL_FIELDS["prefill"] + POOL_FIELDS["decode"] + ENGINE_FIELDS + LOAD_FIELDS \
    + TARGET_FIELDS
OUTER_FIELDS = ["name", "cluster", "purpose"]
ALL_FIELD_NAMES = OUTER_FIELDS + [f.name for f in SPEC_FIELDS + FACT_FIELDS]

_PATH_TO_FIELD = {f"spec.{f.path}": f.name for f in SPEC_FIELDS} | {"name": "name", "cluster": "cluster"}


def default_values(instance_type: str = "g6e.12xlarge") -> dict[str, str]:
    """Initial form values: one node per pool of `instance_type`, all its GPUs, TP over all of them."""
    gpus = INSTANCE_TYPES[instance_type].gpus
    gpu_runtime = next(r.key for r in RUNTIMES.values() if r.accelerator == "gpu")
    values = {"runtime": gpu_runtime}
    for p in POOLS:
        values |= {f"{p}_instance_type": instance_type, f"{p}_nodes": "1", f"{p}_gpus_per_node": str(gpus),
                   f"{p}_tensor_parallel_size": str(max(gpus, 1)), f"{p}_replicas_min": "1",
                   f"{p}_replicas_max": "1"}
    e, ld = EngineSpec(), LoadSpec()
    values |= {"engine_max_model_len": str(e.max_model_len), "engine_dtype": e.dtype,
               "engine_gpu_memory_utilization": str(e.gpu_memory_utilization),
               "engine_kv_connector": e.kv_connector,
               "load_requests_per_second": f"{ld.requests_per_second:g}",
               "load_mean_prompt_tokens": str(ld.mean_prompt_tokens),
               "load_mean_output_tokens": str(ld.mean_output_tokens)}
    return values


def choices_for(field: Field) -> list[tuple[str, str]]:
    if field.name.endswith("instance_type"):
        return [(i.name, _instance_label(i)) for i in INSTANCE_TYPES.values()]
    if field.name == "runtime":
        return [(r.key, f"Ray {r.ray} · vLLM {r.vllm}{' (CPU)' if r.accelerator == 'cpu' else ''}")
                for r in RUNTIMES.values()]
    if field.name == "engine_dtype":
        return [(d, d) for d in DTYPES]
    if field.name == "engine_kv_connector":
        return [(k, k) for k in KV_CONNECTORS]
    return []


def _instance_label(i) -> str:
    if not i.gpus:
        return f"{i.name} — CPU only (local target)"
    # The catalog's price, the same on every cluster: the plan panel shows the cost at the chosen cluster's prices.
    return f"{i.name} — {i.gpus}× {i.gpu} {i.gpu_memory_gib} GiB, ${i.hourly_usd:.2f}/h on-demand"


def _convert(raw: str, kind: str):
    """Numbers where the text is one; otherwise the text itself, so the validator names what is wrong."""
    raw = raw.strip()
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        return raw
    return raw


def _put(target: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[leaf] = value


def spec_from_form(data) -> dict:
    """The request-shaped spec from POSTed form data. Blank numbers are left out so defaults apply;
    a blank GPUs-per-node or TP follows the instance type (all its GPUs)."""
    spec: dict = {}
    for f in SPEC_FIELDS:
        raw = (data.get(f.name) or "").strip()
        if raw == "":
            continue
        _put(spec, f.path, _convert(raw, f.kind))
    for p in POOLS:
        pool = spec.get(p, {})
        instance = INSTANCE_TYPES.get(pool.get("instance_type"))
        if instance is not None and "gpus_per_node" not in pool:
            pool["gpus_per_node"] = instance.gpus
        if "tensor_parallel_size" not in pool and isinstance(pool.get("gpus_per_node"), int):
            pool["tensor_parallel_size"] = max(pool["gpus_per_node"], 1)
    return spec


def facts_from_form(data) -> dict | None:
    facts = {}
    for f in FACT_FIELDS:
        value = _convert((data.get(f.name) or ""), f.kind)
        if isinstance(value, int):
            facts[f.path] = value
    return facts or None


def values_from_spec(spec: DeploymentSpec) -> dict[str, str]:
    """Form values from a stored (validated) spec, for the edit/update form."""
    values = {"model_id": spec.model_id, "model_source": spec.model_source, "runtime": spec.runtime}
    for f in SPEC_FIELDS:
        section, _, key = f.path.partition(".")
        part = getattr(spec, section, None)  # the pools, engine, load, targets; model and runtime are above
        if is_dataclass(part) and key and getattr(part, key) is not None:
            v = getattr(part, key)
            values[f.name] = f"{v:g}" if isinstance(v, float) else str(v)
    return values


def errors_by_field(errors: dict[str, list[str]]) -> tuple[dict[str, list[str]], list[str]]:
    """Split SpecError paths into per-field messages and the rest (shown above the form)."""
    by_field: dict[str, list[str]] = {}
    other: list[str] = []
    for path, messages in errors.items():
        name = _PATH_TO_FIELD.get(path)
        if name is None and path.startswith("spec."):
            # "spec.model" or "spec.prefill": attach to the first field of that section.
            section = path.removeprefix("spec.")
            name = next((f.name for f in SPEC_FIELDS if f.path.startswith(section + ".")), None)
        if name is None:
            other.extend(f"{path}: {m}" for m in messages)
        else:
            by_field.setdefault(name, []).extend(messages)
    return by_field, other


def instance_gpus() -> dict[str, int]:
    """For the form's script: instance type → GPUs per node."""
    return {name: i.gpus for name, i in INSTANCE_TYPES.items()}
