"""How long a deployment whose nodes are ready may take to serve before Tandem gives up on it and releases its nodes:
its planned start (the runtime image pulled, the weights loaded, the engines started) plus the cluster's grace, or
the cluster's own `serving_deadline_minutes`.

The planned start is an upper estimate from the spec alone, shown with its parts so a person can check it. Weights
are not known before they load (on S3 or the Hub the control plane never reads them), so they are bounded by what a
replica's GPUs hold: a model has to fit there with room for its KV cache, so half of it is a generous bound.
"""
from dataclasses import dataclass

from deployments.catalog import INSTANCE_TYPES, RUNTIMES
from deployments.serve_config import STAGES
from deployments.spec import DeploymentSpec

IMAGE_GIB = 15  # the CUDA runtime images are about 15 GiB compressed (workers.targets.eks_launch_template)
PULL_MB_S = 100  # what one node pulls and unpacks from a registry, conservatively
WEIGHTS_SHARE = 0.5  # of a replica's GPU memory: the weights' bound (the rest holds the KV cache)
LOAD_MB_S = 500  # weights from S3 or the Hub onto one node and into its GPUs
GPU_ENGINE_S = 180  # vLLM's start on GPUs: CUDA context, CUDA graph capture, compilation
# vLLM's CPU build on the local target: 80-110 s by hand, up to 4 minutes through Tandem on a busy 2-core machine,
# about 8 minutes for a second generation beside a loaded one (FACTS.md, 2026-11-29 and 2026-12-07).
CPU_START_S = 8 * 60
MIB = 2**20


@dataclass(frozen=True)
class ServingDeadline:
    """The seconds from nodes ready to serving that are allowed, and how they were reckoned."""

    seconds: int
    why: str


def planned_start(spec: DeploymentSpec, *, pulls_image: bool) -> tuple[int, str]:
    """Seconds the slowest stage is expected to take from its nodes ready to serving, and the parts of it."""
    if RUNTIMES[spec.runtime].accelerator == "cpu":
        return CPU_START_S, f"vLLM's CPU build starts in up to {CPU_START_S // 60} min on a busy machine"
    image = IMAGE_GIB * 1024 / PULL_MB_S if pulls_image else 0
    weights = max(spec.pool(s).tensor_parallel_size * INSTANCE_TYPES[spec.pool(s).instance_type].gpu_memory_gib
                  for s in STAGES) * WEIGHTS_SHARE
    load = weights * 1024 / LOAD_MB_S
    parts = ([f"the {IMAGE_GIB} GiB image pulled in {image / 60:.0f} min"] if pulls_image else []) + [
        f"up to {weights:.0f} GiB of weights loaded in {load / 60:.0f} min",
        f"the engines started in {GPU_ENGINE_S // 60} min"]
    return int(image + load + GPU_ENGINE_S), ", ".join(parts)


def serving_deadline(spec: DeploymentSpec, *, config, target_kind: str) -> ServingDeadline:
    """The deadline for `spec` on a cluster with this typed config (deployments.cluster_config)."""
    if config.serving_deadline_minutes is not None:
        minutes = config.serving_deadline_minutes
        return ServingDeadline(minutes * 60, f"the cluster's serving deadline of {minutes} min")
    planned, parts = planned_start(spec, pulls_image=target_kind != "ray")
    grace = config.serving_grace_minutes
    return ServingDeadline(planned + grace * 60, f"its planned start of {planned / 60:.0f} min ({parts}) and the "
                                                 f"cluster's grace of {grace} min")
