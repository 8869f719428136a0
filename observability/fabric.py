"""Which fabric KV really moves over: the NIXL backend each engine instantiated (from the engines' own logs) and
the rate of real transfers (pd_health's bytes and seconds), against what the spec asked for.

NIXL's agent reports each backend it creates and each one it skips because its plugin did not load (its Python
API, ai-dynamo/nixl src/api/python/_api.py: "Backend <name> was instantiated", "Skipping backend registration
<name> due to the missing plugin."). On an EFA instance type, KV moves over EFA only through the LIBFABRIC backend
(with FI_PROVIDER=efa); UCX, NIXL's default, runs there at TCP speed (ai-dynamo/nixl#909), and one published peer
measured TTFT near 98 s instead of 0.2 s that way. A deployment that asked for EFA and got either does not open to
users (deployments.conditions.endpoint_ready) until it is fixed, or its spec opts in to TCP (engine.kv_transport).
"""
import re

from deployments.catalog import INSTANCE_TYPES
from deployments.serve_config import STAGES
from deployments.spec import DeploymentSpec

INSTANTIATED = re.compile(r"Backend (\w+) was instantiated")
SKIPPED = re.compile(r"Skipping backend registration,? (\w+),? due to the missing plugin")
EFA_BACKEND = "LIBFABRIC"


def nixl_backends(log_text: str) -> dict:
    """{"instantiated": [...], "missing": [...]}: the NIXL backends an engine's log says it created or skipped."""
    return {"instantiated": sorted(set(INSTANTIATED.findall(log_text))),
            "missing": sorted(set(SKIPPED.findall(log_text)))}


def wants_efa(spec: DeploymentSpec) -> bool:
    """Whether KV should move over EFA: both pools on EFA instance types and the spec did not opt in to TCP."""
    return spec.engine.kv_transport == "efa" and all(INSTANCE_TYPES[spec.pool(s).instance_type].has_efa
                                                     for s in STAGES)


def kv_fabric(*, spec: DeploymentSpec, logs: dict[str, str] | None, health: dict) -> dict:
    """The fabric verdict: `ok` (True, False, or None when nothing tells), the backends each stage's engines
    instantiated, and messages that say why and how to fix it."""
    backends = {stage: nixl_backends(text) for stage, text in (logs or {}).items()}
    result = {"asked": "efa" if wants_efa(spec) else "tcp", "backends": backends, "ok": True, "messages": []}
    if result["asked"] == "tcp":
        result["messages"].append("TCP (the spec's engine.kv_transport, or instance types without EFA): "
                                  "no fabric check.")
        return result
    problems = []
    for stage, found in backends.items():
        if EFA_BACKEND in found["missing"]:
            problems.append(f"{stage}: NIXL's {EFA_BACKEND} backend failed to load (its plugin or libfabric is "
                            "missing from the image)")
        elif found["instantiated"] and EFA_BACKEND not in found["instantiated"]:
            problems.append(f"{stage}: NIXL instantiated {', '.join(found['instantiated'])}, not {EFA_BACKEND}: "
                            "KV moves over TCP")
    if health.get("verdict") == "slow_link":
        problems.append(health["messages"][0] if health.get("messages") else "KV moved at TCP speed")
    if problems:
        result["ok"] = False
        result["messages"].append(
            "KV does not move over EFA on these EFA instance types: " + "; ".join(problems) + ". Fix: run an image "
            "with libfabric and the EFA libraries (the runtime's EFA image), with the pods' vpc.amazonaws.com/efa "
            "devices and hugepages, and check `tandemctl doctor` on the cluster (efa-device-plugin, "
            "efa-security-group, subnets); or accept TCP by setting engine.kv_transport: tcp in the spec.")
        return result
    if not all(EFA_BACKEND in backends.get(stage, {}).get("instantiated", []) for stage in STAGES):
        result["ok"] = None  # nothing wrong seen, nothing right either: it opens, and says so
        result["messages"].append("The engines' logs do not show which NIXL backend each stage uses; the fabric "
                                  "is not confirmed.")
        return result
    rate = f" at about {health['throughput_gbps']:g} Gbit/s" if health.get("throughput_gbps") else ""
    result["messages"].append(f"KV moves over EFA: both stages instantiated NIXL's {EFA_BACKEND} backend{rate}.")
    return result
