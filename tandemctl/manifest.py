"""Manifests: YAML files a team keeps in git. The envelope is checked here; the spec is the API's own (the server
validates it, so there is one set of rules):

    apiVersion: tandem.dev/v1
    kind: Deployment
    metadata: {team: ml-research, name: chat, cluster: gpu-prod, purpose: "optional"}
    spec: {...}          # exactly the `spec` of POST /api/v1/deployments/
"""
from dataclasses import dataclass
from pathlib import Path

import yaml

from tandemctl.errors import USAGE, CliError

API_VERSION = "tandem.dev/v1"
KINDS = ("Deployment",)
SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Manifest:
    source: str
    team: str
    name: str
    cluster: str
    purpose: str | None
    spec: dict

    @property
    def ref(self) -> str:
        return f"{self.team}/{self.name}"


def _one(doc, source: str) -> Manifest:
    if not isinstance(doc, dict):
        raise CliError(f"{source}: a manifest is a mapping with apiVersion, kind, metadata and spec.", USAGE)
    if doc.get("apiVersion") != API_VERSION:
        raise CliError(f"{source}: apiVersion must be {API_VERSION}; got {doc.get('apiVersion')!r}.", USAGE)
    if doc.get("kind") not in KINDS:
        raise CliError(f"{source}: kind must be one of {', '.join(KINDS)}; got {doc.get('kind')!r}.", USAGE)
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) and meta[k] for k in
                                             ("team", "name", "cluster")):
        raise CliError(f"{source}: metadata needs team, name and cluster (strings).", USAGE)
    if unknown := set(doc) - {"apiVersion", "kind", "metadata", "spec"}:
        raise CliError(f"{source}: unknown top-level keys {', '.join(sorted(unknown))}.", USAGE)
    if not isinstance(doc.get("spec"), dict):
        raise CliError(f"{source}: spec must be a mapping (the API's deployment spec).", USAGE)
    purpose = meta.get("purpose")
    return Manifest(source=source, team=meta["team"], name=meta["name"], cluster=meta["cluster"],
                    purpose=None if purpose is None else str(purpose), spec=doc["spec"])


def manifests_load(path: str) -> list[Manifest]:
    """Every manifest in a file (several YAML documents allowed) or in a directory's *.yaml/*.yml files, sorted."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in SUFFIXES and f.is_file())
        if not files:
            raise CliError(f"{path}: no .yaml or .yml files.", USAGE)
    elif p.is_file():
        files = [p]
    else:
        raise CliError(f"{path}: no such file or directory.", USAGE)
    found = []
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except yaml.YAMLError as e:
            raise CliError(f"{f}: not YAML: {e}", USAGE) from None
        found += [_one(d, f"{f}" + (f"#{i}" if len(docs) > 1 else "")) for i, d in enumerate(docs)]
    return found
