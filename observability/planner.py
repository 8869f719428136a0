"""The capacity planner: a pure function from model facts and a PD spec to memory fit, KV sizes, link load,
a verdict in the seed's terms and hourly cost, with the arithmetic shown as lines a person can check."""
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.cost import ON_DEMAND, Prices, spec_hourly_usd
from deployments.model_sources import SourceRoots
from deployments.spec import LOCAL_PATH, DeploymentSpec, PoolSpec, SpecError, spec_parse
from observability.model_facts import DTYPE_BYTES, ModelFacts, estimate_params, model_facts_parse  # noqa: F401
from observability.fleet_calibration import FleetWindow
from observability.planner_targets import latency_plan, targets_plan

GIB = 1024**3
CPU_KV_SPACE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE on the local target
FleetReader = Callable[[DeploymentSpec], Iterable[FleetWindow]]
LINK_TIGHT = 0.5  # share of the link the expected KV traffic may take before the plan warns


def model_facts_from_source(source: str, roots: SourceRoots | None) -> dict | None:
    """config.json of a local model source (the local target) inside the roots the cluster allows the team, else
    None. Without roots (no cluster named) nothing is read: a plan must not read any file a user names."""
    if roots is None or not isinstance(source, str) or not LOCAL_PATH.match(source):
        return None
    path = roots.readable_file(source, "config.json")
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            facts = json.load(f)
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) else None


def model_facts_read(source: str, roots: SourceRoots) -> tuple[ModelFacts | None, str]:
    """A stored deployment's model facts from its config.json (model_facts_from_source: a local source inside the
    roots), else None and why, in words a member can act on. Nothing else is a source of facts for it: a request's
    entered facts are not kept, and weights on S3 or Hugging Face are not read by the control plane."""
    raw = model_facts_from_source(source, roots)
    if raw is None:
        if source.startswith("s3://"):
            where = f"its weights are on S3 ({source}), and Tandem reads a model's config.json only from a local path"
        elif not source.startswith("/"):
            where = (f"its weights come from Hugging Face ({source}), and Tandem reads a model's config.json only "
                     "from a local path")
        else:
            where = f"no config.json can be read in {source} inside the model sources the cluster allows the team"
        return None, f"{where}, so the performance model has no facts for this model"
    try:
        return model_facts_parse(raw), ""
    except SpecError as e:
        why = " ".join(f"{k}: {m}" for k, v in e.errors.items() for m in v)
        return None, f"{source}/config.json does not give the facts the performance model needs ({why})"


def _gb(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _pool_plan(name: str, pool: PoolSpec, facts: ModelFacts, spec: DeploymentSpec, dtype_bytes: int,
               lines: list[str], prices: Prices) -> dict:
    inst = INSTANCE_TYPES[pool.instance_type]
    tp = pool.tensor_parallel_size
    weights_total = facts.param_count * dtype_bytes
    eff_kv_heads = math.ceil(facts.num_kv_heads / tp) * tp  # TP above the KV heads replicates them
    kv_per_token = 2 * facts.num_layers * eff_kv_heads * facts.head_dim * dtype_bytes
    if not inst.gpus:
        kv_space = CPU_KV_SPACE_GIB * GIB
        tokens = kv_space // kv_per_token
        lines.append(f"{name}: CPU engine, KV space {CPU_KV_SPACE_GIB} GiB (VLLM_CPU_KVCACHE_SPACE) / "
                     f"{kv_per_token:,} B per token = {tokens:,} tokens per replica.")
        per_gpu, usable, fits = weights_total, None, True
    else:
        per_gpu = weights_total / tp
        usable = inst.gpu_memory_gib * GIB * spec.engine.gpu_memory_utilization
        fits = per_gpu < usable
        kv_space = max(usable - per_gpu, 0) * tp
        tokens = int(kv_space // kv_per_token)
        lines.append(f"{name}: weights {facts.param_count:,} params × {dtype_bytes} B = {_gb(weights_total)}; "
                     f"/ TP {tp} = {_gb(per_gpu)} per GPU.")
        lines.append(f"{name}: usable per GPU {inst.gpu_memory_gib} GiB × {spec.engine.gpu_memory_utilization} = "
                     f"{_gb(usable)}; {'fits' if fits else 'DOES NOT FIT'}; KV space "
                     f"({_gb(usable)} − {_gb(per_gpu)}) × {tp} GPUs = {_gb(kv_space)} per replica.")
        lines.append(f"{name}: {_gb(kv_space)} / {kv_per_token:,} B per token = {tokens:,} KV tokens per replica.")
    seqs = tokens // spec.engine.max_model_len
    lines.append(f"{name}: {tokens:,} tokens / max_model_len {spec.engine.max_model_len:,} = {seqs:,} sequences "
                 f"at full length per replica × {pool.replicas_max} replicas = {seqs * pool.replicas_max:,}.")
    return {"instance_type": pool.instance_type, "tensor_parallel_size": tp, "replicas_max": pool.replicas_max,
            "weights_bytes_per_gpu": int(per_gpu), "usable_bytes_per_gpu": int(usable) if usable else None,
            "fits": fits, "kv_bytes_per_token": kv_per_token, "kv_tokens_per_replica": tokens,
            "max_seqs_at_max_len_per_replica": seqs, "max_seqs_at_max_len": seqs * pool.replicas_max,
            "nodes": pool.nodes, "hourly_usd": round(prices.pools_hourly_usd([(pool.instance_type, pool.nodes)]), 3)}


def plan(facts: ModelFacts, spec: DeploymentSpec, *, prices: Prices, assumed_itl_ms: float = 30.0,
         fleet=()) -> dict:
    """The plan for this model on this spec (pure: no I/O), costed at `prices` (the cluster's); `fleet`: what
    running deployments of this model measured (observability.fleet_calibration.FleetWindow), which corrects the
    expected latency."""
    lines: list[str] = []
    dtype = spec.engine.dtype if spec.engine.dtype != "auto" else facts.dtype
    b = DTYPE_BYTES[dtype]
    kv_tok = 2 * facts.num_layers * facts.num_kv_heads * facts.head_dim * b
    lines.append(f"KV per token = 2 (K and V) × {facts.num_layers} layers × {facts.num_kv_heads} KV heads × "
                 f"{facts.head_dim} head dim × {b} B ({dtype}) = {kv_tok:,} B.")
    pools = {n: _pool_plan(n, getattr(spec, n), facts, spec, b, lines, prices) for n in ("prefill", "decode")}
    load = spec.expected_load
    block = RUNTIMES[spec.runtime].kv_block_tokens  # NIXL moves whole blocks of the engine's block size
    blocks = math.ceil(load.mean_prompt_tokens / block)
    kv_req = blocks * block * pools["prefill"]["kv_bytes_per_token"]
    lines.append(f"KV moved per request: {load.mean_prompt_tokens:,} prompt tokens → {blocks:,} blocks of "
                 f"{block} (the engine's block size) = {blocks * block:,} tokens × "
                 f"{pools['prefill']['kv_bytes_per_token']:,} B = {kv_req:,} B.")
    pi, di = INSTANCE_TYPES[spec.prefill.instance_type], INSTANCE_TYPES[spec.decode.instance_type]
    need_gbps = kv_req * load.requests_per_second * 8 / 1e9
    link = min(pi.network_gbps, di.network_gbps)
    efa = pi.has_efa and di.has_efa
    util = need_gbps / link if link else None
    lines.append(f"Link needed: {kv_req:,} B × {load.requests_per_second:g} req/s × 8 = {need_gbps:,.3f} Gbit/s; "
                 + (f"link {link:g} Gbit/s ({'EFA' if efa else 'no EFA: TCP'}) → {util:.1%} of it."
                    if link else "same machine (no network link)."))
    warnings = []
    if util is not None and util > LINK_TIGHT:
        warnings.append(f"KV traffic needs {util:.0%} of the {link:g} Gbit/s link: the link, not the GPUs, limits "
                        "throughput, and adding nodes will not buy more.")
    if link and not efa:
        warnings.append("No EFA on this path: NIXL moves KV over TCP, usually well below the nominal figure.")

    # One node of the decode type with all its GPUs, as the seed's alternative to PD.
    node_gpus = max(di.gpus, 1)
    weights_total = facts.param_count * b
    node_usable = di.gpu_memory_gib * GIB * spec.engine.gpu_memory_utilization * node_gpus if di.gpus else None
    itl_s = assumed_itl_ms / 1000
    concurrency = load.requests_per_second * load.mean_output_tokens * itl_s
    in_flight = math.ceil(concurrency * (load.mean_prompt_tokens + load.mean_output_tokens))
    if node_usable is None:
        fits_node, node_tokens = True, pools["decode"]["kv_tokens_per_replica"]
    else:
        eff = math.ceil(facts.num_kv_heads / node_gpus) * node_gpus
        node_kv_tok = 2 * facts.num_layers * eff * facts.head_dim * b
        fits_node = weights_total < node_usable
        node_tokens = int(max(node_usable - weights_total, 0) // node_kv_tok)
        lines.append(f"One {di.name} ({node_gpus} GPUs, TP {node_gpus}): {_gb(node_usable)} usable − "
                     f"{_gb(weights_total)} weights → {node_tokens:,} KV tokens.")
    lines.append(f"At the expected load: {load.requests_per_second:g} req/s × {load.mean_output_tokens} output "
                 f"tokens × {assumed_itl_ms:g} ms per token (assumed) = {concurrency:,.1f} requests in flight × "
                 f"{load.mean_prompt_tokens + load.mean_output_tokens:,} tokens = {in_flight:,} KV tokens.")
    if not all(p["fits"] for p in pools.values()):
        verdict = "does_not_fit"
        text = ("The weights do not fit the GPUs of a pool at its tensor-parallel size: raise "
                "tensor_parallel_size or pick GPUs with more memory.")
    elif fits_node and in_flight <= node_tokens:
        verdict = "single_node_enough"
        text = (f"Fits on one {di.name} and one node holds the KV in flight at this load: prefill/decode "
                "separation only adds scheduling and operational overhead here.")
    else:
        verdict = "pd_pays"
        text = ("The model does not fit one node: PD across nodes pays." if not fits_node else
                f"Throughput-bound: the load needs {in_flight:,} KV tokens in flight, more than one node's "
                f"{node_tokens:,}; separating prefill and decode pays.")
    latency = latency_plan(spec, facts=replace(facts, dtype=dtype), kv_bytes_per_request=kv_req, link_gbps=link,
                           lines=lines, fleet=fleet)
    targets = targets_plan(spec, latency, lines=lines)
    hourly = round(spec_hourly_usd(spec, prices=prices), 3)
    lines.append(f"Cost: prefill {spec.prefill.nodes} × {pi.name} ${prices.node_hour_usd(pi.name):g}/h + decode "
                 f"{spec.decode.nodes} × {di.name} ${prices.node_hour_usd(di.name):g}/h = ${hourly:,.3f}/h.")
    return {
        "model": asdict(facts) | {"dtype_bytes": b},
        "kv_bytes_per_token": kv_tok,
        "kv_block_tokens": block,
        "kv_tokens_per_request": blocks * block,
        "kv_bytes_per_request": kv_req,
        "pools": pools,
        "bandwidth": {"needed_gbps": round(need_gbps, 4), "link_gbps": link, "efa": efa,
                      "utilization": round(util, 4) if util is not None else None},
        "single_node": {"instance_type": di.name, "fits": fits_node, "kv_tokens": node_tokens,
                        "kv_tokens_in_flight": in_flight, "assumed_itl_ms": assumed_itl_ms},
        "verdict": verdict,
        "verdict_text": text,
        "warnings": warnings,
        "hourly_usd": hourly,
        "latency": latency,
        "targets": targets,
        "arithmetic": lines,
    }


def plan_for_spec(spec_input: dict, model_facts: dict | None, *, assumed_itl_ms: float = 30.0,
                  source_roots: SourceRoots | None = None, fleet: FleetReader | None = None,
                  prices: Prices = ON_DEMAND) -> dict:
    """For the portal and the API: validate the request-shaped spec, then plan it (plan_with_facts); without a
    cluster chosen, at the catalog's on-demand prices."""
    return plan_with_facts(spec_parse(spec_input, source_roots=source_roots), model_facts, prices=prices,
                           assumed_itl_ms=assumed_itl_ms, source_roots=source_roots, fleet=fleet)


def plan_with_facts(spec: DeploymentSpec, model_facts: dict | None, *, prices: Prices, assumed_itl_ms: float = 30.0,
                    source_roots: SourceRoots | None = None, fleet: FleetReader | None = None) -> dict:
    """Plan a typed spec with the facts given, or, when none are, the local model's config.json if it lies inside
    `source_roots` (the model sources the spec's cluster allows its team); `fleet` reads what running deployments
    of the spec's model measured (observability.selectors.fleet_windows). Raises SpecError with field paths a form
    can show."""
    source = "given"
    if not model_facts:
        model_facts = model_facts_from_source(spec.model_source, source_roots)
        source = f"{spec.model_source}/config.json"
    if not model_facts:
        raise SpecError({"model_facts": ["Give the model's facts (num_layers, hidden_size, num_attention_heads, "
                                         "num_kv_heads, head_dim, dtype, param_count): its source cannot be read "
                                         "from here."]})
    result = plan(model_facts_parse(model_facts), spec, prices=prices, assumed_itl_ms=assumed_itl_ms,
                  fleet=fleet(spec) if fleet else ())
    result["model"]["facts_from"] = source
    return result
