"""The live plan shown beside the request form and in the approvals queue.

When the planner cannot answer (a half-typed spec, missing model facts), the panel says why and still shows
GPUs against the team's quota.
"""
import logging
from collections.abc import Callable

from deployments.catalog import INSTANCE_TYPES
from deployments.cost import Prices
from deployments.model_sources import SourceRoots
from deployments.quota_rules import node_quota_gpus, quota_basis
from deployments.serve_config import STAGES
from deployments.services.quota import team_gpus_held
from deployments.spec import DeploymentSpec, SpecError, spec_check
from observability.pd_health import bytes_span_text
from observability.planner import FleetReader, plan_for_spec, plan_with_facts

log = logging.getLogger(__name__)


def _answer(planner: Callable[[], dict]) -> tuple[dict | None, str]:
    """(plan, note): the planner's answer, or None with a note saying why there is none."""
    try:
        return planner(), ""
    except SpecError as e:
        if set(e.errors) == {"model_facts"}:
            return None, ("Enter the model facts below (from its config.json) to see memory fit, KV bytes per "
                          "token and per request, and the bandwidth the expected load needs.")
        return None, "No plan until the spec is valid: " + " ".join(m for v in e.errors.values() for m in v)
    except Exception as e:  # a half-typed spec (e.g. a string where a number goes) must not break the form
        log.info("planner refused the spec: %s", e)
        return None, f"No plan for this spec yet: {e}"


def plan(spec_input: dict, model_facts: dict | None = None, *, source_roots: SourceRoots | None = None,
         fleet: FleetReader, prices: Prices) -> tuple[dict | None, str]:
    """The plan beside the request form, for a request-shaped (maybe half-typed) spec; facts come from the weights
    only inside the model sources the chosen cluster allows the team; `fleet` (observability.selectors.fleet_reader)
    reads what running deployments of the same model measured, which corrects the expected latency; `prices`: the
    chosen cluster's."""
    return _answer(lambda: plan_for_spec(spec_input, model_facts, source_roots=source_roots, fleet=fleet,
                                         prices=prices))


def plan_for_stored(spec: DeploymentSpec, *, source_roots: SourceRoots, fleet: FleetReader,
                    prices: Prices) -> tuple[dict | None, str]:
    """The plan for a stored spec (approvals, the deployment page): checked against today's catalog and the model
    sources its cluster allows its team first (an approver sees a runtime found broken since), facts come from the
    weights when readable there; costed at its cluster's prices."""
    plan_, note = _answer(lambda: plan_with_facts(spec_check(spec, source_roots=source_roots), None, prices=prices,
                                                  source_roots=source_roots, fleet=fleet))
    if plan_ is None and note.startswith("Enter the model facts"):
        note = ("No capacity plan: the request does not carry the model's config.json facts and its weights "
                "cannot be read from here.")
    return plan_, note


def kv_observed(run) -> str:
    """What NIXL moved in a conformance run, as far as Ray's histogram buckets tell."""
    health = (run.pd_health or {}) if run else {}
    transfers, span = health.get("nixl_transfers"), health.get("nixl_bytes_range")
    if not transfers or not span:
        return ""
    return (f"NIXL in the last conformance run: {transfers:g} transfers, {bytes_span_text(*span)} in all (Ray exports NIXL's sizes "
            "as histogram buckets, so bytes are known to the bucket).")


def _input_pools(spec_input: dict) -> dict[str, tuple]:
    """(instance type, nodes, GPUs per node) of each pool of a request-shaped (maybe half-typed) spec."""
    pools = {}
    for stage in STAGES:
        p = spec_input.get(stage) if isinstance(spec_input.get(stage), dict) else {}
        gpus = p.get("gpus_per_node")
        if gpus is None and p.get("instance_type") in INSTANCE_TYPES:
            gpus = INSTANCE_TYPES[p["instance_type"]].gpus
        pools[stage] = (p.get("instance_type"), p.get("nodes", 1), gpus)
    return pools


def gpus_of(spec_input: dict, *, target_kind: str) -> int:
    """GPUs a request-shaped spec counts against quota on this kind of cluster, counting only what is readable
    (the form may be half typed)."""
    total = 0
    for instance_type, nodes, gpus in _input_pools(spec_input).values():
        per_node = node_quota_gpus(instance_type=instance_type, gpus_per_node=gpus, target_kind=target_kind)
        if isinstance(nodes, int) and per_node is not None:
            total += nodes * per_node
    return total


def hourly_cost(spec_input: dict, *, prices: Prices) -> float | None:
    """What a request-shaped (maybe half-typed) spec would cost per hour at these prices (the chosen cluster's)."""
    return prices.pools_hourly_usd((itype, nodes) for itype, nodes, _ in _input_pools(spec_input).values())


def quota_basis_of(spec_input: dict, *, target_kind: str) -> str:
    """How quota counts this request-shaped spec on this kind of cluster, in words (empty while half typed)."""
    return quota_basis(_input_pools(spec_input), target_kind=target_kind)


def stored_quota_basis(spec: DeploymentSpec, *, target_kind: str) -> str:
    pools = {s: (spec.pool(s).instance_type, spec.pool(s).nodes, spec.pool(s).gpus_per_node) for s in STAGES}
    return quota_basis(pools, target_kind=target_kind)


def quota_view(*, team, gpus: int, exclude_id: int | None = None, basis: str = "", held: int | None = None) -> dict:
    """GPUs held by the team (but `exclude_id`; or `held`, counted already), what this request adds, whether it
    fits the quota, and how it was counted."""
    if held is None:
        held = team_gpus_held(team=team, exclude_id=exclude_id)
    after = held + gpus
    quota = team.gpu_quota
    return {"held": held, "gpus": gpus, "after": after, "quota": quota, "fits": after <= quota, "basis": basis,
            "free": max(quota - held, 0),
            "held_pct": min(100, round(100 * held / quota)) if quota else 100,
            "add_pct": min(100 - min(100, round(100 * held / quota)), round(100 * gpus / quota)) if quota else 0}
