"""What a change to a running deployment's spec touches, and which of it needs an approver again.

A change goes through without approval only when it changes nothing that costs and nothing an approver judged:
replica bounds that stay within the approved ones, engine tuning that leaves memory per GPU as it was
(`max_model_len`, the KV connector), the latency targets (what is judged, not what runs), and the purpose text
(not part of the spec). Everything else (model, weights, runtime, instance types, nodes, GPUs, tensor
parallelism, dtype, memory utilization, the expected load the plan was judged on) becomes a proposed spec that
waits. Pure functions over typed specs.
"""
from dataclasses import asdict, dataclass
from enum import StrEnum

from deployments.cost import Prices, spec_hourly_usd
from deployments.serve_config import STAGES
from deployments.spec import DeploymentSpec

# Engine settings that do not change what a GPU holds: vLLM sizes its KV space from gpu_memory_utilization, so
# a longer or shorter max_model_len changes how many sequences fit, not the memory taken.
FREE_FIELDS = frozenset({"engine.max_model_len", "engine.kv_connector",
                         # When Tandem may pause and wake it: pausing only ever lowers what it costs.
                         "pause.idle_minutes", "pause.wake_on_request"})


class Approval(StrEnum):
    """When a change of a field needs an approver (the API's schema states it of each field: x-needs-approval)."""

    ALWAYS = "always"
    NEVER = "never"
    OUTSIDE_APPROVED_RANGE = "outside_approved_range"  # replica bounds: only when outside the approved range


def field_approval(field: str) -> Approval:
    """When a change of `field` (a dotted path of the stored spec) needs an approver."""
    stage, _, leaf = field.partition(".")
    if field in FREE_FIELDS or stage in ("targets", "rollout"):
        return Approval.NEVER
    if stage in STAGES and leaf in ("replicas_min", "replicas_max"):
        return Approval.OUTSIDE_APPROVED_RANGE
    return Approval.ALWAYS


@dataclass(frozen=True)
class FieldChange:
    """One field of the spec, before and after, and whether this change alone needs an approver."""

    field: str
    old: object
    new: object
    needs_approval: bool


def _flat(spec: DeploymentSpec) -> dict[str, object]:
    out = {}

    def walk(prefix: str, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", spec.to_dict())  # no targets: no keys, so adding them shows each field None → value
    return out


def _replicas_within(old: DeploymentSpec, new: DeploymentSpec, stage: str, leaf: str) -> bool:
    """The new bound lies inside the approved range (the spec's own rules keep min ≤ max)."""
    o = old.pool(stage)
    return o.replicas_min <= getattr(new.pool(stage), leaf) <= o.replicas_max


def spec_changes(old: DeploymentSpec, new: DeploymentSpec) -> list[FieldChange]:
    """Every field that differs, in the spec's order, each marked with whether it needs approval."""
    before, after = _flat(old), _flat(new)
    changes = []
    for field in before | after:
        if before.get(field) == after.get(field):
            continue
        approval = field_approval(field)
        if approval == Approval.OUTSIDE_APPROVED_RANGE:
            stage, _, leaf = field.partition(".")
            needs = not _replicas_within(old, new, stage, leaf)
        else:
            needs = approval == Approval.ALWAYS
        changes.append(FieldChange(field, before.get(field), after.get(field), needs))
    return changes


def spec_created(new: DeploymentSpec) -> list[FieldChange]:
    """A new request as changes: every field None → its value, all of it waiting for the request's approval."""
    return [FieldChange(field, None, value, True) for field, value in _flat(new).items()]


def changes_needing_approval(old: DeploymentSpec, new: DeploymentSpec) -> list[str]:
    """The fields (dotted paths) whose change from `old` to `new` needs an approver; empty: apply at once."""
    return [c.field for c in spec_changes(old, new) if c.needs_approval]


def proposal_summary(old: DeploymentSpec, new: DeploymentSpec, *, prices: Prices) -> dict:
    """What an approver reviews: each changed field old → new, and the cost per hour before and after at the
    cluster's prices."""
    before, after = spec_hourly_usd(old, prices=prices), spec_hourly_usd(new, prices=prices)
    return {
        "changes": [asdict(c) for c in spec_changes(old, new)],
        "hourly_usd_before": None if before is None else round(before, 3),
        "hourly_usd_after": None if after is None else round(after, 3),
    }
