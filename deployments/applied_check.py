"""Applied is what was asked: what the API server kept of a RayService Tandem wrote, read back and compared.

An API server prunes every field its CRD's structural schema does not declare, without an error (at most a
`Warning` header the official client ignores). An older KubeRay CRD thus drops fields Tandem relies on and the
deployment waits for ever; this says which, and which KubeRay release keeps them (catalog.KUBERAY_FIELDS_SINCE).
"""
import re

from deployments.catalog import KUBERAY_FIELDS_SINCE

_INDEX = re.compile(r"\[\d+\]")
# Values Tandem relies on (generic paths under `spec`): another value there (an admission webhook's) is a RayService
# Tandem did not ask for. Elsewhere a changed value (an image rewritten to a registry mirror, say) is left alone.
RELIED_ON = (
    "serveConfigV2",
    "rayClusterConfig.authOptions",
    "rayClusterConfig.workerGroupSpecs[].resources",
    "rayClusterConfig.workerGroupSpecs[].replicas",
    "rayClusterConfig.workerGroupSpecs[].template.spec.tolerations",
    "rayClusterConfig.workerGroupSpecs[].template.spec.nodeSelector",
    "rayClusterConfig.workerGroupSpecs[].template.spec.containers[].resources",
    "rayClusterConfig.headGroupSpec.template.spec.containers[].resources",
)


def applied_differences(asked, stored, path: str = "") -> tuple[list[str], list[str]]:
    """(dropped, changed): paths of `asked` that `stored` lacks, and of the values Tandem relies on (RELIED_ON) that
    `stored` holds otherwise, each as a generic path (`a.b[].c`, once). What `stored` holds beyond `asked`
    (defaults, another writer's additions) is not a difference."""
    dropped: list[str] = []
    changed: list[str] = []
    _compare(asked, stored, path, dropped, changed)
    return _unique(dropped), [p for p in _unique(changed) if p.startswith(RELIED_ON)]


def _compare(asked, stored, path: str, dropped: list[str], changed: list[str]) -> None:
    if isinstance(asked, dict) and isinstance(stored, dict):
        for key, value in asked.items():
            child = f"{path}.{key}" if path else key
            if key not in stored:
                dropped.append(child)
            else:
                _compare(value, stored[key], child, dropped, changed)
    elif isinstance(asked, list) and isinstance(stored, list):
        for i, value in enumerate(asked):
            if i >= len(stored):
                dropped.append(f"{path}[{i}]")
            else:
                _compare(value, stored[i], f"{path}[{i}]", dropped, changed)
    elif asked != stored:
        changed.append(path)


def _unique(paths: list[str]) -> list[str]:
    return list(dict.fromkeys(_INDEX.sub("[]", p) for p in paths))


def applied_mismatch_message(*, dropped: list[str], changed: list[str], cluster: str, kuberay_min: str) -> str:
    """What the user reads when the stored RayService is not the one Tandem applied (paths under `spec`)."""
    parts = []
    if dropped:
        named = [f"spec.{p} (needs KubeRay ≥ {KUBERAY_FIELDS_SINCE[p]})" if p in KUBERAY_FIELDS_SINCE
                 else f"spec.{p}" for p in dropped]
        parts.append(f"KubeRay on {cluster} dropped {', '.join(named)}: its RayService CRD does not declare "
                     f"{'them' if len(named) > 1 else 'it'}. Upgrade KubeRay's CRDs and operator to {kuberay_min} or "
                     "newer, then retry.")
    if changed:
        parts.append(f"{cluster} changed spec.{', spec.'.join(changed)} of the RayService after Tandem applied it "
                     "(an admission webhook?); Tandem will not run a RayService other than the one it asked for.")
    return " ".join(parts) + " The RayService was removed."
