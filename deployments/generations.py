"""Whether two generations of a deployment can share KV: a prefill of one handing KV to a decode of the other.

They can when nothing that decides what the KV cache means changed: the weights (model source and id), the
runtime (vLLM's version, and with it the connector's and NIXL's), the dtype, the KV connector and transport, and
each pool's tensor parallelism (how heads split across ranks). Pure functions over typed specs; the verdict is
recorded on the rollout (deployments.models.Rollout.verdict).
"""
from dataclasses import dataclass

from deployments.spec import STAGES, DeploymentSpec

@dataclass(frozen=True)
class Verdict:
    compatible: bool
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"compatible": self.compatible, "reasons": list(self.reasons)}


def _spec_reasons(old: DeploymentSpec, new: DeploymentSpec) -> list[str]:
    reasons = []
    if old.model_source != new.model_source:
        reasons.append(f"model.source changed ({old.model_source} → {new.model_source}): other weights")
    if old.model_id != new.model_id:
        reasons.append(f"model.id changed ({old.model_id} → {new.model_id})")
    if old.runtime != new.runtime:
        reasons.append(f"runtime changed ({old.runtime} → {new.runtime}): another vLLM, connector and NIXL")
    if old.engine.dtype != new.engine.dtype:
        reasons.append(f"engine.dtype changed ({old.engine.dtype} → {new.engine.dtype})")
    if old.engine.kv_connector != new.engine.kv_connector:
        reasons.append(f"engine.kv_connector changed ({old.engine.kv_connector} → {new.engine.kv_connector})")
    if old.engine.kv_transport != new.engine.kv_transport:
        reasons.append(f"engine.kv_transport changed ({old.engine.kv_transport} → {new.engine.kv_transport})")
    for stage in STAGES:
        a, b = old.pool(stage).tensor_parallel_size, new.pool(stage).tensor_parallel_size
        if a != b:
            reasons.append(f"{stage}.tensor_parallel_size changed ({a} → {b}): heads split otherwise")
    return reasons


def kv_verdict(old: DeploymentSpec, new: DeploymentSpec) -> Verdict:
    """Whether the old and new generation may exchange KV, and if not, every reason why."""
    reasons = _spec_reasons(old, new)
    return Verdict(compatible=not reasons, reasons=tuple(reasons))
