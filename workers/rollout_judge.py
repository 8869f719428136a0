"""Whether a rollout step's new generation is worse than the old by more than the spec allows, judged by what users
felt at the gateway over the same window (usage.selectors.generation_stats): the share of failed requests, the
median time to first token and the share of requests that met the latency targets. Pure.
"""
from dataclasses import dataclass, field

from deployments.spec import RolloutSpec

# Fewer requests than this on the new generation in a window: too few to judge, so nothing is held against it.
MIN_JUDGED = 5


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...] = ()
    evidence: dict = field(default_factory=dict)


def _figures(stats) -> dict:
    return {"requests": stats.requests, "failed": stats.failed, "ttft_p50_ms": stats.ttft_p50_ms,
            "ttft_p95_ms": stats.ttft_p95_ms, "attained": stats.attained}


def _rate(figures: dict) -> float:
    return figures["failed"] / figures["requests"] if figures["requests"] else 0.0


def judge(*, old, new, rollout: RolloutSpec, baseline: dict | None = None) -> Verdict:
    """`old` and `new`: each generation's figures over the window (GenerationStats). `baseline`: the old
    generation's figures of an earlier step, used when it served nothing in this one (the last step, at 100%)."""
    a = baseline if baseline is not None else _figures(old)
    b = _figures(new)
    evidence = {"old": a, "new": b}
    if b["requests"] < MIN_JUDGED:
        return Verdict(ok=True, reasons=(f"only {b['requests']} request(s) on the new generation: too few to "
                                         "judge",), evidence=evidence)
    reasons = []
    increase = _rate(b) - _rate(a)
    if increase > rollout.max_error_rate_increase:
        reasons.append(f"failed requests {_rate(b):.1%} against {_rate(a):.1%} (allowed +"
                       f"{rollout.max_error_rate_increase:.1%})")
    if a["ttft_p50_ms"] and b["ttft_p50_ms"] and b["ttft_p50_ms"] > a["ttft_p50_ms"] * rollout.max_ttft_ratio:
        reasons.append(f"median time to first token {b['ttft_p50_ms']:.0f} ms against {a['ttft_p50_ms']:.0f} ms "
                       f"(allowed ×{rollout.max_ttft_ratio:g})")
    if a["attained"] is not None and b["attained"] is not None and \
            a["attained"] - b["attained"] > rollout.max_attainment_drop:
        reasons.append(f"targets met by {b['attained']:.1%} of requests against {a['attained']:.1%} (allowed -"
                       f"{rollout.max_attainment_drop:.1%})")
    return Verdict(ok=not reasons, reasons=tuple(reasons), evidence=evidence)
