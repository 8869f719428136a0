"""Which image a deployment's Ray pods run on a Kubernetes cluster, and the rules for the images a cluster registers.

A cluster names, per runtime, the image its Ray pods run, pinned by digest (setting `runtime_images`, e.g.
{"ray-2.60.0-vllm-0.29.0": "123456789012.dkr.ecr.us-west-2.amazonaws.com/tandem-runtime@sha256:<64 hex>"}): the
image deploy/runtime/Dockerfile builds, which the team pushes to its own registry (docs/install.md, step 5). The head
and both pools run that one image, so the Ray cluster has one Python environment, and a digest cannot be moved to
other content after a deployment was approved onto it.

A cluster with no image registered for the spec's runtime:
- `eks`: refused at request and approval, and by a reconcile pass, before any GPU is bought: Tandem would pay for
  nodes whose image nobody has shown to exist (`tandemctl doctor`'s `runtime-images` check shows a registered one
  does, in the cluster's own ECR registry).
- `kubernetes`: the runtime's public Ray LLM image by tag (catalog `base_image`), which the applied event says,
  unless a stage moves its KV over EFA: that image has no libfabric, so NIXL's LIBFABRIC backend cannot load, and
  the spec is refused as on `eks`.
"""
import re
from dataclasses import dataclass

from deployments.catalog import RUNTIMES
from deployments.serve_config import kv_over_efa
from deployments.spec import STAGES, DeploymentSpec

REGISTER_FIX = "build and register the runtime image (docs/install.md, step 5)"
PINNED_FORM = "<registry>/<repository>@sha256:<64 hex digits>"

# The grammar of distribution/reference (reference.go), which Docker, containerd and the kubelet parse image
# references with: domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]; domain := components
# joined by '.', then an optional ':' port; path-component := [a-z0-9]+ joined by a separator [_.] | __ | -+; a
# sha256 digest is 64 lowercase hex digits. A tag (":tag") is left out on purpose: the digest alone names the image.
_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_COMPONENT}(?:\.{_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
PINNED = re.compile(rf"(?P<registry>{_DOMAIN})/(?P<repository>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
                    r"@(?P<digest>sha256:[0-9a-f]{64})")
# A private ECR registry's host (AWS's Amazon ECR endpoints): <account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn].
ECR_REGISTRY = re.compile(r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)"
                          r"\.amazonaws\.com(?P<china>\.cn)?")


@dataclass(frozen=True)
class PinnedImage:
    """An image reference pinned by digest: registry host, repository and `sha256:<hex>`."""

    registry: str
    repository: str
    digest: str

    @property
    def ref(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def ecr(self) -> re.Match | None:
        """The registry as a private ECR registry (account, region), or None."""
        return ECR_REGISTRY.fullmatch(self.registry)


def pinned_image_parse(value: str) -> PinnedImage | None:
    """The reference as a PinnedImage, or None when it is not one (`pinned_image_errors` says why)."""
    m = PINNED.fullmatch(value) if isinstance(value, str) else None
    if m is None or not _explicit_registry(m["registry"]):
        return None
    return PinnedImage(m["registry"], m["repository"], m["digest"])


def _explicit_registry(host: str) -> bool:
    # distribution/reference reads a first component as a registry only with a '.' or ':' in it, or `localhost`;
    # else it is a Docker Hub repository ("rayproject/ray-llm" is docker.io/rayproject/ray-llm).
    return "." in host or ":" in host or host == "localhost"


def pinned_image_errors(value, *, region: str = "") -> list[str]:
    """Messages for a reference that is not an image pinned by digest, or whose ECR registry is in another region
    than `region` (the cluster's, when it has one)."""
    if not isinstance(value, str) or not value:
        return [f"an image pinned by digest, {PINNED_FORM}."]
    if "@" not in value:
        return [f"{value!r} names a tag, not a digest: a tag can be moved to other content after a deployment is "
                f"approved, so the image is pinned by digest, {PINNED_FORM} (docs/install.md, step 5 prints it)."]
    m = PINNED.fullmatch(value)
    if m is None:
        return [f"{value!r} is not an image reference pinned by digest: {PINNED_FORM}, lowercase repository, "
                "no tag."]
    if not _explicit_registry(m["registry"]):
        return [f"{value!r} names no registry host: give it in full, e.g. docker.io/{value}."]
    ecr = ECR_REGISTRY.fullmatch(m["registry"])
    if ecr and region and ecr["region"] != region:
        return [f"{value!r} is in the ECR registry of {ecr['region']}, but the cluster is in {region}: push the "
                f"image to {region} (docs/install.md, step 5). A pull across regions is slower, billed per GB and "
                "bypasses the VPC's ECR endpoints."]
    return []


def runtime_images_errors(images, *, kind: str, region: str = "") -> list[str]:
    """Messages for a cluster's `runtime_images` setting: {GPU runtime this kind runs: image pinned by digest}."""
    usable = sorted(k for k, r in RUNTIMES.items() if r.accelerator == "gpu" and kind in r.target_kinds)
    example = f'{{"{usable[0]}": "{PINNED_FORM}"}}' if usable else "{}"
    if not isinstance(images, dict):
        return [f"runtime_images: an object of runtime → the image its Ray pods run, pinned by digest, e.g. "
                f"{example}."]
    errors = []
    for key, value in images.items():
        if key not in usable:
            errors.append(f"runtime_images: {key!r} is not a GPU runtime a {kind} cluster runs; known: "
                          f"{', '.join(usable)}.")
            continue
        errors += [f"runtime_images: {key}: {e}" for e in pinned_image_errors(value, region=region)]
    return errors


@dataclass(frozen=True)
class RuntimeImage:
    """The one image every Ray pod of a deployment runs: the cluster's registered one (pinned by digest) or the
    runtime's public image by tag."""

    ref: str
    registered: bool


def runtime_image_of(*, kind: str, config, spec: DeploymentSpec) -> RuntimeImage | None:
    """The image for the spec's runtime on a cluster of this kind and typed config (deployments.cluster_config),
    or None when it has none it may use (`runtime_image_errors` says why)."""
    runtime = RUNTIMES[spec.runtime]
    if registered := (getattr(config, "runtime_images", None) or {}).get(runtime.key):
        return RuntimeImage(registered, registered=True)
    if kind == "kubernetes" and runtime.base_image and not any(kv_over_efa(spec, s) for s in STAGES):
        return RuntimeImage(runtime.base_image, registered=False)
    return None


def runtime_image_errors(*, cluster, spec: DeploymentSpec) -> list[str]:
    """Why the cluster cannot run the spec's runtime for want of an image (empty when it can, or is not Kubernetes)."""
    if cluster.kind not in ("eks", "kubernetes") or runtime_image_of(kind=cluster.kind, config=cluster.config_typed,
                                                                      spec=spec):
        return []
    if cluster.kind == "eks":
        why, fix = "an eks cluster's Ray pods run only a registered image", REGISTER_FIX
    else:
        why = ("a stage moves its KV over EFA (engine.kv_transport efa on an EFA instance type), and the public Ray "
               "LLM image has no libfabric for it")
        fix = f"{REGISTER_FIX}, or set engine.kv_transport to tcp"
    return [f"Cluster {cluster.name} has no image registered for runtime {spec.runtime} (its runtime_images "
            f"setting), and {why}: {fix}."]


def public_image_note(image: str) -> str:
    """What the applied event adds when the Ray pods run a runtime's public image by tag ("" for a pinned one)."""
    if "@" in image:
        return ""
    return (f"its Ray pods run the public image {image} by tag, as no image is registered for its runtime on this "
            "cluster (runtime_images): register one to pin it by digest (docs/install.md, step 5)")
