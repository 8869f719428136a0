"""The per-stage advisor: from targets, attainment and per-stage metrics to diagnoses, each naming the stage
that misses a target with its evidence, and, where a spec change helps, a concrete recommendation.

Pure: no I/O. The rules, in the order they are tried:
- TTFT missed, and prefill's queue grows over the window (its p95 in the later half above QUEUE_GROWTH × the
  earlier half's) or requests wait in the prefill engine: prefill is short of replicas.
- TTFT missed, and KV transfer p95 takes at least KV_SHARE of the TTFT p95: the link (EFA or NIXL's backend,
  as observability.pd_health names them).
- TTFT missed with neither: each request's own prefill is the time; more replicas do not shorten it.
- ITL missed, and decode's KV cache peaks at KV_CACHE_HIGH or above, requests wait in decode, or its running
  sequences per replica reach RUNNING_HIGH of the engine's max_num_seqs (where Tandem sets it): decode is short.
- ITL missed with none of these: decode's own per-token time at this batch.
- Every target met, over a window of at least LONG_WINDOW_S, with a pool's KV cache below LOW_USE and nothing
  waiting: that pool can shrink.
Figures come from Ray's histogram buckets, so stage times are known to the bucket. What a change (or a larger
tensor-parallel size) is expected to give comes from the performance model, with the fit's range, the profile it
used and the fleet's correction (observability.advisor_expected); without the model's facts it says why not.
"""
import hashlib
import json
import math
from dataclasses import dataclass, field, replace

from deployments.catalog import INSTANCE_TYPES
from deployments.cost import Prices, spec_hourly_usd
from deployments.serve_config import CPU_MAX_NUM_SEQS
from deployments.spec import DeploymentSpec, PoolSpec
from deployments.spec_diff import changes_needing_approval, spec_changes
from observability.advisor_expected import (ModelBasis, Traffic, decode_compute, itl_with_decode_replicas,
                                             prefill_compute, traffic_of, ttft_with_prefill_replicas)
from observability.attainment import Attainment
from observability.histograms import Hist
from observability.snapshot import Increase

QUEUE_GROWTH = 1.5
KV_SHARE = 0.25
KV_CACHE_HIGH = 0.8
RUNNING_HIGH = 0.8
LOW_USE = 0.25
LONG_WINDOW_S = 6 * 3600


@dataclass(frozen=True)
class StageMetrics:
    """One window's per-stage figures from the engines' scrapes: p95 times (ms) and gauge peaks, by pool."""

    window: str
    seconds: int
    queue_p95_ms: float | None = None
    queue_p95_ms_early: float | None = None  # the first half of the window
    queue_p95_ms_late: float | None = None  # the second half
    prefill_p95_ms: float | None = None
    kv_transfer_p95_ms: float | None = None
    engine_ttft_p95_ms: float | None = None
    engine_itl_p95_ms: float | None = None
    waiting_peak: dict = field(default_factory=dict)  # pool → peak requests waiting
    running_peak: dict = field(default_factory=dict)  # pool → peak requests running (summed over replicas)
    kv_cache_peak: dict = field(default_factory=dict)  # pool → peak KV cache usage (0..1, highest replica)
    requests: int = 0  # answered at the gateway in the window, and their tokens
    prompt_tokens: int = 0
    output_tokens: int = 0


def _p95(inc: Increase, stage: str, pool: str) -> float | None:
    h = inc.hist.get((stage, pool))
    return h.quantile(0.95) if h and h.count else None


def stage_metrics_from(early: Increase, late: Increase, *, window: str, seconds: int) -> StageMetrics:
    """StageMetrics from what the engines reported in the two halves of a window (scrape increases, or
    rollups merged per half): percentiles over both halves, the queue per half, gauge peaks over both."""
    whole = Increase()
    for part in (early, late):
        for key, h in part.hist.items():
            whole.hist.setdefault(key, Hist()).add(h)
        for key, v in part.gauge.items():
            whole.gauge[key] = max(whole.gauge.get(key, v), v)

    def peaks(name: str) -> dict:
        return {pool: v for (n, pool), v in whole.gauge.items() if n == name}

    return StageMetrics(
        window=window, seconds=seconds,
        queue_p95_ms=_p95(whole, "queue", "prefill"), queue_p95_ms_early=_p95(early, "queue", "prefill"),
        queue_p95_ms_late=_p95(late, "queue", "prefill"), prefill_p95_ms=_p95(whole, "prefill", "prefill"),
        kv_transfer_p95_ms=_p95(whole, "kv_transfer", "decode"), engine_ttft_p95_ms=_p95(whole, "ttft", "prefill"),
        engine_itl_p95_ms=_p95(whole, "itl", "decode"),
        waiting_peak=peaks("waiting"), running_peak=peaks("running"), kv_cache_peak=peaks("kv_cache_usage"))


@dataclass(frozen=True)
class Evidence:
    name: str
    value: float | None
    unit: str

    def to_json(self) -> dict:
        return {"name": self.name, "value": None if self.value is None else round(self.value, 3), "unit": self.unit}


@dataclass(frozen=True)
class Recommendation:
    """A concrete spec change: what it changes, what it adds (GPUs, USD per hour at the cluster's prices),
    what it is expected to do, and which fields of it need an approver (empty: within the approved bounds)."""

    pool: str
    summary: str
    spec: DeploymentSpec
    changes: tuple[tuple[str, object, object], ...]
    gpus_delta: int
    hourly_usd_delta: float
    expected: str
    needs_approval: tuple[str, ...]
    prediction: dict | None = None  # the expected figure, its range, profile and fleet correction; or why none

    @property
    def id(self) -> str:
        """Names this change, so applying it later applies what the member saw (or is refused as stale)."""
        return hashlib.sha256(json.dumps(self.changes, default=str).encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        return {"id": self.id, "pool": self.pool, "summary": self.summary,
                "changes": [{"field": f, "old": o, "new": n} for f, o, n in self.changes],
                "gpus_delta": self.gpus_delta, "hourly_usd_delta": round(self.hourly_usd_delta, 3),
                "expected": self.expected, "prediction": self.prediction,
                "needs_approval": list(self.needs_approval)}


@dataclass(frozen=True)
class Diagnosis:
    """Which stage misses (or could give back) what, why, the figures that show it and the window they span."""

    kind: str  # prefill_short, link, prefill_compute, decode_short, decode_compute, can_shrink
    stage: str  # prefill, kv_transfer, decode
    message: str
    window: str
    evidence: tuple[Evidence, ...]
    recommendation: Recommendation | None = None
    expected: str = ""  # a stage bound by its own compute: what the model gives it, at twice the tensor parallelism
    prediction: dict | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "message": self.message, "window": self.window,
                "evidence": [e.to_json() for e in self.evidence], "expected": self.expected,
                "prediction": self.prediction,
                "recommendation": self.recommendation.to_json() if self.recommendation else None}


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f} ms" if v >= 10 else f"{v:,.2f} ms"


def _nodes_for(p: PoolSpec, replicas: int) -> int:
    """Nodes whose GPUs hold `replicas` of this pool's tensor-parallel size (CPU pools place replicas by cores
    and keep their nodes)."""
    return max(math.ceil(replicas * p.tensor_parallel_size / p.gpus_per_node), 1) if p.gpus_per_node else p.nodes


def _grown(spec: DeploymentSpec, stage: str) -> DeploymentSpec:
    """One replica more than the floor: within the approved ceiling when there is room (its nodes are already
    there), else a higher ceiling with the nodes its GPUs need."""
    p = spec.pool(stage)
    r = p.replicas_min + 1
    if r <= p.replicas_max:
        return replace(spec, **{stage: replace(p, replicas_min=r)})
    return replace(spec, **{stage: replace(p, replicas_min=r, replicas_max=r, nodes=max(p.nodes, _nodes_for(p, r)))})


def _shrunk(spec: DeploymentSpec, stage: str) -> DeploymentSpec:
    """One replica fewer at the ceiling, and only the nodes the rest need."""
    p = spec.pool(stage)
    r = p.replicas_max - 1
    return replace(spec, **{stage: replace(p, replicas_min=min(p.replicas_min, r), replicas_max=r,
                                           nodes=min(p.nodes, _nodes_for(p, r)))})


def _recommendation(spec: DeploymentSpec, stage: str, new_spec: DeploymentSpec,
                    expected: tuple[str, dict | None], prices: Prices) -> Recommendation:
    old_p, new_p = spec.pool(stage), new_spec.pool(stage)
    nodes = new_p.nodes - old_p.nodes
    before, after = spec_hourly_usd(spec, prices=prices), spec_hourly_usd(new_spec, prices=prices)
    changes = tuple((c.field, c.old, c.new) for c in spec_changes(spec, new_spec))
    return Recommendation(
        pool=stage, summary=f"{stage} replicas {_replicas_text(old_p)} → {_replicas_text(new_p)}"
        + (f", nodes {old_p.nodes} → {new_p.nodes}" if nodes else ""),
        spec=new_spec, changes=changes, gpus_delta=nodes * old_p.gpus_per_node,
        hourly_usd_delta=(after or 0.0) - (before or 0.0), expected=expected[0],
        needs_approval=tuple(changes_needing_approval(spec, new_spec)), prediction=expected[1])


def _replicas_text(p: PoolSpec) -> str:
    return str(p.replicas_min) if p.replicas_min == p.replicas_max else f"{p.replicas_min}–{p.replicas_max}"


def _one_more(spec: DeploymentSpec, stage: str, expected, prices: Prices) -> Recommendation:
    """One more replica (`_grown`); `expected(r, r2)` says what going from r to r2 replicas should do: (line,
    figures)."""
    r = spec.pool(stage).replicas_min
    return _recommendation(spec, stage, _grown(spec, stage), expected(r, r + 1), prices)


def _link_text(spec: DeploymentSpec) -> str:
    pi, di = INSTANCE_TYPES[spec.prefill.instance_type], INSTANCE_TYPES[spec.decode.instance_type]
    if pi.has_efa and di.has_efa:
        return ("the EFA link between the pools: check that NIXL uses its LIBFABRIC backend "
                "(kv_connector_extra_config.backends) and that the pods have vpc.amazonaws.com/efa resources and "
                "hugepages; UCX over EFA runs at TCP speed")
    if not pi.network_gbps or not di.network_gbps:
        return ("NIXL's transfer between the pools on the same machine (no network link): check the NIXL "
                "backend and that both engines export their KV in the engine's block size")
    return (f"the link between the pools: no EFA on this path ({pi.name} ↔ {di.name}), so NIXL moves KV over TCP; "
            "an instance type with EFA in both pools gives the link the bandwidth it needs")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _ttft(spec: DeploymentSpec, att, m: StageMetrics, model: ModelBasis, traffic: Traffic,
          prices: Prices) -> list[Diagnosis]:
    ttft = att.observed_p95_ms if att.observed_p95_ms is not None else m.engine_ttft_p95_ms
    shares = (Evidence("TTFT p95 at the gateway", att.observed_p95_ms, "ms"),
              Evidence("TTFT target", att.target_ms, "ms"),
              Evidence("requests meeting it", (att.share or 0) * 100, "%"),
              Evidence("required", att.required_share * 100, "%"),
              Evidence("prefill queue p95", m.queue_p95_ms, "ms"),
              Evidence("prefill p95", m.prefill_p95_ms, "ms"),
              Evidence("KV transfer p95", m.kv_transfer_p95_ms, "ms"))
    out = []
    early, late = m.queue_p95_ms_early, m.queue_p95_ms_late
    growing = early is not None and late is not None and late > QUEUE_GROWTH * early
    waiting = m.waiting_peak.get("prefill", 0) or 0
    if growing or waiting > 0:
        def expected(r, r2):
            return ttft_with_prefill_replicas(model, spec, traffic, ttft_ms=ttft, queue_ms=m.queue_p95_ms,
                                              replicas=r2, target_ms=att.target_ms)
        signs = ([f"its queue p95 grows from {_ms(early)} in the first half of the window to {_ms(late)} in the "
                  "second"] if growing else []) + ([f"up to {waiting:g} requests wait in it"] if waiting else [])
        out.append(Diagnosis(
            "prefill_short", "prefill",
            f"TTFT misses its target and prefill falls behind ({'; '.join(signs)}): prefill is short of replicas.",
            m.window, shares + (Evidence("prefill queue p95, first half", early, "ms"),
                                Evidence("prefill queue p95, second half", late, "ms"),
                                Evidence("requests waiting in prefill (peak)", waiting, "requests")),
            _one_more(spec, "prefill", expected, prices)))
    kv = m.kv_transfer_p95_ms
    if kv is not None and ttft and kv >= KV_SHARE * ttft:
        out.append(Diagnosis(
            "link", "kv_transfer",
            f"TTFT misses its target and KV transfer alone takes {_ms(kv)} at p95, {kv / ttft:.0%} of the TTFT "
            f"p95 ({_ms(ttft)}): the cause is {_link_text(spec)}. More replicas do not make the link faster.",
            m.window, shares))
    if not out:
        line, prediction = prefill_compute(model, spec, traffic)
        out.append(Diagnosis(
            "prefill_compute", "prefill",
            f"TTFT misses its target ({_ms(ttft)} at p95 against {_ms(att.target_ms)}) with no queue building up "
            f"and KV moving in {_ms(kv)}: the time is each request's own prefill ({_ms(m.prefill_p95_ms)} at p95). "
            "More replicas do not shorten one request's prefill; a faster GPU, a larger tensor-parallel size or "
            "shorter prompts do.", m.window, shares, expected=_sentence(line), prediction=prediction))
    return out


def _itl(spec: DeploymentSpec, att, m: StageMetrics, model: ModelBasis, traffic: Traffic,
         prices: Prices) -> list[Diagnosis]:
    d = spec.decode
    kv, waiting = m.kv_cache_peak.get("decode"), m.waiting_peak.get("decode", 0) or 0
    running = m.running_peak.get("decode")
    max_seqs = CPU_MAX_NUM_SEQS if not INSTANCE_TYPES[d.instance_type].gpus else None
    per_replica = running / d.replicas_max if running is not None else None
    evidence = (Evidence("ITL p95 at the gateway", att.observed_p95_ms, "ms"),
                Evidence("ITL target", att.target_ms, "ms"),
                Evidence("requests meeting it", (att.share or 0) * 100, "%"),
                Evidence("required", att.required_share * 100, "%"),
                Evidence("decode KV cache usage (peak)", None if kv is None else kv * 100, "%"),
                Evidence("decode running sequences (peak)", running, "requests"),
                Evidence("requests waiting in decode (peak)", waiting, "requests"))
    busy = ((kv is not None and kv >= KV_CACHE_HIGH) or waiting > 0
            or (max_seqs and per_replica is not None and per_replica >= RUNNING_HIGH * max_seqs))
    if busy:
        def expected(r, r2):
            return itl_with_decode_replicas(model, spec, traffic, running=running, itl_ms=att.observed_p95_ms,
                                            replicas_now=r, replicas=r2, target_ms=att.target_ms)
        return [Diagnosis(
            "decode_short", "decode",
            f"ITL misses its target and decode is full (KV cache peak {'n/a' if kv is None else f'{kv:.0%}'}, "
            f"{running if running is not None else 'n/a'} sequences running, {waiting:g} waiting at peak): "
            "decode is short of replicas.", m.window, evidence, _one_more(spec, "decode", expected, prices))]
    line, prediction = decode_compute(model, spec, traffic, running=running)
    return [Diagnosis(
        "decode_compute", "decode",
        f"ITL misses its target ({_ms(att.observed_p95_ms)} at p95 against {_ms(att.target_ms)}) while decode has "
        "room (KV cache and running sequences low, nothing waiting): the time is the engine's own per-token step. "
        "More replicas do not shorten it; a faster GPU or a larger tensor-parallel size for decode does.",
        m.window, evidence, expected=_sentence(line), prediction=prediction)]


def _shrunk_latency(spec: DeploymentSpec, stage: str, atts, m: StageMetrics, model: ModelBasis,
                    traffic: Traffic) -> tuple[str, dict | None]:
    """What the stage's target is expected to become with one replica fewer ("", None: no target on it)."""
    r = spec.pool(stage).replicas_max
    att = next((a for a in atts if a.measure == ("itl" if stage == "decode" else "ttft")), None)
    if att is None:
        return "", None
    if stage == "decode":
        return itl_with_decode_replicas(model, spec, traffic, running=m.running_peak.get("decode"),
                                        itl_ms=att.observed_p95_ms, replicas_now=r, replicas=r - 1,
                                        target_ms=att.target_ms)
    return ttft_with_prefill_replicas(model, spec, traffic, ttft_ms=att.observed_p95_ms, queue_ms=m.queue_p95_ms,
                                      replicas=r - 1, target_ms=att.target_ms)


def _shrink(spec: DeploymentSpec, atts, m: StageMetrics, model: ModelBasis, traffic: Traffic,
            prices: Prices) -> list[Diagnosis]:
    for stage in ("decode", "prefill"):
        p = spec.pool(stage)
        kv, waiting = m.kv_cache_peak.get(stage), m.waiting_peak.get(stage, 0) or 0
        if p.replicas_max <= 1 or kv is None or kv >= LOW_USE or waiting:
            continue
        latency, prediction = _shrunk_latency(spec, stage, atts, m, model, traffic)
        rec = _recommendation(spec, stage, _shrunk(spec, stage), (
            f"expected: {stage} KV cache peak ≈ {kv:.0%} × {p.replicas_max}/{p.replicas_max - 1} = "
            f"{kv * p.replicas_max / (p.replicas_max - 1):.0%}" + (f"; {latency}" if latency else ""), prediction),
            prices)
        evidence = tuple(Evidence(f"{a.measure.upper()} requests meeting the target", (a.share or 0) * 100, "%")
                         for a in atts) + (Evidence(f"{stage} KV cache usage (peak)", kv * 100, "%"),
                                           Evidence(f"requests waiting in {stage} (peak)", waiting, "requests"))
        return [Diagnosis("can_shrink", stage,
                          f"Every target was met over {m.window} while {stage}'s KV cache peaked at {kv:.0%} with "
                          f"nothing waiting: {stage} can give back a replica.", m.window, evidence, rec)]
    return []


def advise(*, spec: DeploymentSpec, attainment: Attainment, metrics: StageMetrics, model: ModelBasis,
           prices: Prices) -> list[Diagnosis]:
    """The diagnoses for one window (empty: nothing to say, e.g. no targets or no requests measured); `model`: what
    the expected figures are predicted with (observability.services.advice.model_basis_read); `prices`: the
    deployment's cluster's, which price what a recommendation adds."""
    out: list[Diagnosis] = []
    traffic = traffic_of(spec, requests=metrics.requests, prompt_tokens=metrics.prompt_tokens,
                         output_tokens=metrics.output_tokens, seconds=metrics.seconds)
    ttft, itl = attainment.of("ttft"), attainment.of("itl")
    if ttft is not None and ttft.ok is False:
        out += _ttft(spec, ttft, metrics, model, traffic, prices)
    if itl is not None and itl.ok is False:
        out += _itl(spec, itl, metrics, model, traffic, prices)
    measured = [a for a in attainment.targets if a.ok is not None]
    if measured and all(a.ok for a in measured) and metrics.seconds >= LONG_WINDOW_S:
        out += _shrink(spec, measured, metrics, model, traffic, prices)
    return out
