"""Rendering deploy/ as `kubectl kustomize` does, and what the tests ask of the rendered objects."""
import functools
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ["eks", "kubernetes"]
WORKLOADS = {"Deployment", "Job"}
# Cluster-scoped kinds newer than kustomize 5.5's built-in schema: it writes the kustomization's namespace on them,
# which the API server drops from a cluster-scoped object (and kubectl leaves out of the URL).
UNKNOWN_CLUSTER_SCOPED = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@functools.cache
def render(overlay: str) -> tuple[dict, ...]:
    """Every object `kubectl kustomize deploy/overlays/<overlay>` renders."""
    if shutil.which("kubectl") is None:
        raise RuntimeError("kubectl is needed to render deploy/ (kubectl kustomize); install kubectl 1.32+.")
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "overlays" / overlay)],
                         capture_output=True, text=True, check=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def find(objects, kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def api_path(obj: dict) -> str:
    """The object's URL on an API server (plural = lower-cased kind + s, true for every kind deploy/ uses)."""
    group_version = obj["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("ss") else "s")
    plural = {"networkpolicys": "networkpolicies",
              "validatingadmissionpolicys": "validatingadmissionpolicies"}.get(plural, plural)
    ns = obj["metadata"].get("namespace") if obj["kind"] not in UNKNOWN_CLUSTER_SCOPED else None
    return f"{base}/namespaces/{ns}/{plural}/{obj['metadata']['name']}" if ns else \
        f"{base}/{plural}/{obj['metadata']['name']}"
