"""Where a cluster lets each team load model weights from: declared roots, checked wherever a spec meets a cluster.

A cluster's config declares them (platform admins only):

    "model_sources": {"paths": ["/models/shared"], "s3": ["s3://acme-models/shared/"], "huggingface": ["meta-llama"],
                      "teams": {"ml": {"paths": ["/models/ml"], "s3": ["s3://acme-ml"]}}}

Every team may use the cluster-wide roots, and a team listed under `teams` its own as well. A cluster that declares
none allows none: that the nodes can read a path or bucket (another team's weights, say) does not make it a
member's to load. Paths are compared after resolving symlinks and `..` (on this machine, which is the nodes' for
the local target), S3 sources by bucket and whole key segments, Hugging Face repos by organisation.
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path

KINDS = ("paths", "s3", "huggingface")
S3_ROOT = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")
HF_ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
ABSOLUTE = re.compile(r"^/[^\x00]{0,1023}$")
KIND_TEXT = {"paths": "paths under", "s3": "S3 under", "huggingface": "Hugging Face organisations"}


def _real(path: str) -> str:
    return os.path.realpath(path)


def s3_parts(uri: str) -> tuple[str, list[str]] | None:
    """(bucket, key segments) of an s3:// URI; None for a key with empty, `.` or `..` segments (ambiguous)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    segments = key.rstrip("/").split("/") if key.rstrip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        return None
    return bucket, segments


@dataclass(frozen=True)
class SourceRoots:
    """The model sources one team may use on one cluster."""

    paths: tuple[str, ...] = ()
    s3: tuple[str, ...] = ()
    huggingface: tuple[str, ...] = ()

    def local_path(self, source: str) -> str | None:
        """The real path of an allowed local source (symlinks and `..` resolved), else None."""
        if not ABSOLUTE.fullmatch(source):
            return None
        real = _real(source)
        for root in map(_real, self.paths):
            if os.path.commonpath([real, root]) == root:
                return real
        return None

    def allows(self, source: str) -> bool:
        if source.startswith("s3://"):
            parts = s3_parts(source)
            return parts is not None and any(
                (root := s3_parts(r)) is not None and root[0] == parts[0]
                and parts[1][: len(root[1])] == root[1] for r in self.s3)
        if source.startswith("/"):
            return self.local_path(source) is not None
        org = source.partition("/")[0].lower()
        return any(org == allowed.lower() for allowed in self.huggingface)

    def readable_file(self, source: str, name: str) -> Path | None:
        """A file inside an allowed local source, by its real path, when that too is inside the roots (a
        `config.json` that is a link to elsewhere is not read)."""
        if self.local_path(source) is None:
            return None
        real = self.local_path(os.path.join(source, name))
        return Path(real) if real else None

    def describe(self) -> str:
        parts = [f"{KIND_TEXT[k]} {', '.join(getattr(self, k))}" for k in KINDS if getattr(self, k)]
        return "; ".join(parts) if parts else "none"


def source_roots_for(declared: dict, team_slug: str) -> SourceRoots:
    """The roots a team may use on a cluster that declares these `model_sources`: the cluster-wide ones and the
    team's own."""
    own = (declared.get("teams") or {}).get(team_slug) or {}
    return SourceRoots(**{k: tuple(dict.fromkeys([*(declared.get(k) or []), *(own.get(k) or [])])) for k in KINDS})


def source_roots_of(*, cluster, team) -> SourceRoots:
    return source_roots_for(cluster.config_typed.model_sources, team.slug)


def not_allowed_message(roots: SourceRoots) -> str:
    if roots == SourceRoots():
        return ("This cluster allows no model sources to your team yet: a platform admin lists them in the "
                "cluster's config (model_sources).")
    return (f"Not a model source this cluster allows your team. Allowed: {roots.describe()}. Ask a platform admin "
            "to add a root to the cluster's model_sources if the weights are yours to use.")


def _roots_errors(value, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: an object with paths, s3 and huggingface lists."]
    errors = []
    for key, items in value.items():
        if key not in KINDS:
            errors.append(f"{where}: unknown key {key!r}; known: {', '.join(KINDS)}.")
            continue
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            errors.append(f"{where}.{key}: a list of strings.")
            continue
        pattern, what = {"paths": (ABSOLUTE, "an absolute path"),
                         "s3": (S3_ROOT, "s3://bucket or s3://bucket/prefix"),
                         "huggingface": (HF_ORG, "a Hugging Face organisation, e.g. meta-llama")}[key]
        errors += [f"{where}.{key}: {item!r} is not {what}." for item in items if not pattern.fullmatch(item)
                   or (key == "s3" and s3_parts(item) is None)]
    return errors


def model_sources_errors(value) -> list[str]:
    """Messages for a `model_sources` config that cannot be used (empty when it is fine)."""
    if not isinstance(value, dict):
        return ["model_sources: an object with paths, s3, huggingface and teams."]
    errors = _roots_errors({k: v for k, v in value.items() if k != "teams"}, "model_sources")
    teams = value.get("teams", {})
    if not isinstance(teams, dict):
        return [*errors, "model_sources.teams: an object of team slug → roots."]
    for slug, roots in teams.items():
        errors += _roots_errors(roots, f"model_sources.teams.{slug}")
    return errors
