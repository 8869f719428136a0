"""What each kind of cluster needs in its (non-secret) config: one frozen dataclass per kind, its defaults
declared once here, parsed once from the stored JSON (`cluster_config_of`, `Cluster.config_typed`) and read
through that by every driver, check and report."""
import re
from dataclasses import dataclass, field, fields

from deployments.catalog import INSTANCE_TYPES
from deployments.model_sources import model_sources_errors
from deployments.runtime_images import runtime_images_errors
from deployments.secret_refs import secret_ref_errors
from deployments.spec import dns_label_errors

AWS_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
URL = re.compile(r"^https?://[^\s/]+(/[^\s]*)?$")
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
KUBE_CONTEXT = re.compile(r"^\S(.{0,251}\S)?$")  # a kubeconfig context's name (kubectl config get-contexts)
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")  # botocore's eks CapacityTypes
PREFIX_MAX = 20  # a DNS-1123 label of at most this, then an optional '-' before the team or deployment name


@dataclass(frozen=True)
class _Common:
    """What every kind may say. A required setting's empty default only stands for "absent": the checks refuse a
    config without it, so no reader ever sees it."""

    metrics_url: str = ""  # Ray's metrics export, comma-separated URLs (one per node)
    prometheus_url: str = ""  # a Prometheus server that scrapes Ray; preferred over metrics_url
    model_sources: dict = field(default_factory=dict)  # where each team may load weights from
    prices: dict = field(default_factory=dict)  # USD per node-hour where it is not the on-demand price
    # Minutes a deployment whose nodes are ready has to serve before it fails and its nodes are released; None: its
    # planned start plus serving_grace_minutes (deployments.serving_deadline).
    serving_deadline_minutes: int | None = None
    serving_grace_minutes: int = 10


@dataclass(frozen=True)
class RayConfig(_Common):
    """An existing Ray cluster, reached through its dashboard."""

    dashboard_url: str = ""  # required
    serve_url: str = ""  # the Serve HTTP proxy; "": the dashboard's host, port 8000


@dataclass(frozen=True)
class _KubeConfig(_Common):
    """What both kinds the kubernetes driver serves may say."""

    namespace_prefix: str = "tandem-"
    hf_token_refs: dict = field(default_factory=dict)  # team slug → secret reference to its Hugging Face token
    # Team slug → the IAM role its Ray pods assume (IRSA): an eks cluster's setting (ONLY_ON), read by the
    # kubernetes driver both kinds share.
    team_roles: dict = field(default_factory=dict)
    # Runtime key → the image its Ray pods run, pinned by digest (deployments.runtime_images, docs/install.md 5).
    runtime_images: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KubernetesConfig(_KubeConfig):
    """Any Kubernetes with KubeRay, reached through a kubeconfig."""

    context: str | None = None  # the kubeconfig's context; None: its current one


@dataclass(frozen=True)
class EksConfig(_KubeConfig):
    """An EKS cluster: Tandem creates its node groups."""

    region: str = ""  # required
    cluster_name: str = ""  # required
    role_arn: str = ""  # assumed for every AWS call on this cluster; "": the worker's own role
    node_role_arn: str = ""  # required
    subnet_ids: tuple = ()  # required
    nodegroup_prefix: str = "tandem-"
    aws_endpoint_url: str | None = None  # None: AWS itself
    kubernetes_endpoint_url: str | None = None  # None: the endpoint EKS reports
    capacity_type: str = "ON_DEMAND"
    capacity_reservation_ids: dict = field(default_factory=dict)  # instance type → reservation id
    # Node groups not ACTIVE this long after provisioning began fail the deployment.
    provisioning_deadline_minutes: int = 45


ClusterConfig = RayConfig | KubernetesConfig | EksConfig
CONFIG_CLASSES: dict[str, type[ClusterConfig]] = {"eks": EksConfig, "kubernetes": KubernetesConfig, "ray": RayConfig}
ONLY_ON = {"team_roles": "eks"}  # settings of a shared dataclass that one kind alone may be given
FIELDS = {kind: {f.name for f in fields(cls)} for kind, cls in CONFIG_CLASSES.items()}
KNOWN_KEYS = {kind: {k for k in names if ONLY_ON.get(k, kind) == kind} for kind, names in FIELDS.items()}


def cluster_config_of(kind: str, config: dict | None) -> ClusterConfig:
    """The typed config of a cluster of this kind, defaults filled in. Stored configs were checked by
    `cluster_config_errors` when written; a key its dataclass does not have is left out."""
    cls = CONFIG_CLASSES[kind]
    given = {k: v for k, v in (config or {}).items() if k in FIELDS[kind]}
    if "subnet_ids" in given and isinstance(given["subnet_ids"], list):
        given["subnet_ids"] = tuple(given["subnet_ids"])
    return cls(**given)


def cluster_config_errors(kind: str | None, config: dict) -> list[str]:
    """Messages for a config this kind of cluster cannot use (empty when it is fine)."""
    if kind not in KNOWN_KEYS:
        return []  # the kind field reports its own error
    if not isinstance(config, dict):
        return ["Must be an object."]
    errors = [f"Unknown setting {k!r} for a {kind} cluster; known: {', '.join(sorted(KNOWN_KEYS[kind]))}."
              for k in config if k not in KNOWN_KEYS[kind]]
    typed = cluster_config_of(kind, config)

    def need(key, pattern, what):
        value = config.get(key)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            errors.append(f"{key}: {what}")

    def maybe(key, pattern, what):
        if key in config:
            need(key, pattern, what)

    def maybe_prefix(key):
        value = config.get(key)
        if key in config and (not isinstance(value, str) or dns_label_errors(value.removesuffix("-"),
                                                                              max_length=PREFIX_MAX)):
            errors.append(f"{key}: lowercase letters, digits and '-', at most {PREFIX_MAX} characters.")

    if kind == "eks":
        need("region", AWS_REGION, "an AWS region such as us-west-2.")
        need("cluster_name", EKS_NAME, "the EKS cluster's name.")
        # The worker assumes it (STS AssumeRole) for every AWS call on this cluster; without it, its own role.
        maybe("role_arn", ROLE_ARN, "an IAM role ARN (arn:aws:iam::123456789012:role/name).")
        # EKS requires both for every managed node group it creates.
        need("node_role_arn", ROLE_ARN, "the node group IAM role ARN (arn:aws:iam::123456789012:role/name), required: "
             "EKS creates no node group without one.")
        errors += _eks_errors(typed)
        maybe_prefix("nodegroup_prefix")
        maybe("aws_endpoint_url", URL, "an http(s) URL.")
        # Reach the API server through a tunnel or proxy instead of the endpoint EKS reports (and tests).
        maybe("kubernetes_endpoint_url", URL, "an http(s) URL.")
    if kind == "kubernetes":
        maybe("context", KUBE_CONTEXT, "the name of a context in the cluster's kubeconfig.")
    if kind in ("eks", "kubernetes"):
        maybe_prefix("namespace_prefix")
        if "hf_token_refs" in config:  # each team's Hugging Face token, copied into its namespace (gated models)
            errors += hf_token_refs_errors(config["hf_token_refs"])
        if "runtime_images" in config:  # the image each runtime's Ray pods run, pinned by digest
            region = config.get("region") if kind == "eks" and isinstance(config.get("region"), str) else ""
            errors += runtime_images_errors(config["runtime_images"], kind=kind, region=region)
    if "model_sources" in config:  # where each team may load weights from (deployments.model_sources)
        errors += model_sources_errors(config["model_sources"])
    if "prices" in config:  # this cluster's USD per node-hour (reserved, spot) where it is not the on-demand price
        errors += prices_errors(config["prices"])
    maybe("prometheus_url", URL, "a Prometheus server's http(s) URL, e.g. http://prometheus:9090.")
    errors += _minutes_errors(config, "serving_deadline_minutes", low=1, optional=True)
    errors += _minutes_errors(config, "serving_grace_minutes", low=0, optional=False)
    if kind in ("eks", "kubernetes"):
        maybe("metrics_url", URL, "the Ray head's metrics export URL, e.g. http://head:8080/metrics.")
    if kind == "ray":
        need("dashboard_url", URL, "the Ray dashboard's http(s) URL, e.g. http://127.0.0.1:8265.")
        maybe("serve_url", URL, "the Serve HTTP proxy's URL, e.g. http://127.0.0.1:8000.")
        maybe("metrics_url", URL, "the metrics export URL, e.g. http://127.0.0.1:8080/metrics.")
    return errors


def _minutes_errors(config: dict, key: str, *, low: int, optional: bool) -> list[str]:
    """A setting of whole minutes between `low` and a day (None allowed when `optional`)."""
    if key not in config or (optional and config[key] is None):
        return []
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 24 * 60:
        return [f"{key}: whole minutes between {low} and 1440" + (", or null." if optional else ".")]
    return []


def _eks_errors(config: EksConfig) -> list[str]:
    """Subnets, capacity, deadline and team roles of an `eks` cluster."""
    errors = []
    subnets = config.subnet_ids
    if not isinstance(subnets, tuple) or not subnets or not all(isinstance(s, str) and SUBNET_ID.fullmatch(s)
                                                                 for s in subnets):
        errors.append("subnet_ids: a list of private subnet ids (subnet-0123456789abcdef0) in one Availability Zone, "
                      "required: EKS creates no node group without subnets, and EFA and KV traffic do not cross "
                      "zones.")
    capacity = config.capacity_type
    if capacity not in CAPACITY_TYPES:
        errors.append(f"capacity_type: one of {', '.join(CAPACITY_TYPES)}.")
    reservations = config.capacity_reservation_ids
    if not isinstance(reservations, dict) or not all(
            t in INSTANCE_TYPES and isinstance(r, str) and RESERVATION_ID.fullmatch(r) for t, r in reservations.items()):
        errors.append("capacity_reservation_ids: an object of instance type → capacity reservation id "
                      "(cr-0123456789abcdef0), e.g. {\"p5.48xlarge\": \"cr-0123456789abcdef0\"}.")
    elif capacity == "CAPACITY_BLOCK" and not reservations:
        errors.append("capacity_reservation_ids: CAPACITY_BLOCK needs the capacity block's reservation id for each "
                      "instance type Tandem may launch on it.")
    deadline = config.provisioning_deadline_minutes
    if isinstance(deadline, bool) or not isinstance(deadline, int) or not 5 <= deadline <= 24 * 60:
        errors.append("provisioning_deadline_minutes: whole minutes between 5 and 1440.")
    roles = config.team_roles
    if not isinstance(roles, dict) or not all(isinstance(t, str) and not dns_label_errors(t) and isinstance(r, str)
                                              and ROLE_ARN.fullmatch(r) for t, r in roles.items()):
        errors.append("team_roles: an object of team slug → the IAM role ARN its Ray pods assume (IRSA), e.g. "
                      "{\"ml-research\": \"arn:aws:iam::123456789012:role/tandem-ml-research\"}.")
    return errors


def hf_token_refs_errors(refs) -> list[str]:
    """Messages for an `hf_token_refs` setting that is not {team slug: secret reference}."""
    if not isinstance(refs, dict) or not all(isinstance(t, str) and not dns_label_errors(t) for t in refs):
        return ["hf_token_refs: an object of team slug → a secret reference to that team's Hugging Face token, "
                "e.g. {\"ml-research\": \"env:TANDEM_CLUSTER_HF_ML_RESEARCH\"}."]
    return [f"hf_token_refs: {team}: {e}" for team, ref in refs.items()
            for e in (secret_ref_errors(ref) if ref and isinstance(ref, str) else ["a secret reference."])]


def prices_errors(prices) -> list[str]:
    """Messages for a `prices` setting that is not {instance type: USD per node-hour ≥ 0}."""
    if not isinstance(prices, dict):
        return ["prices: an object of instance type → USD per node-hour, e.g. {\"p5.48xlarge\": 31.5}."]
    errors = []
    for itype, usd in prices.items():
        if itype not in INSTANCE_TYPES:
            errors.append(f"prices: unknown instance type {itype!r}; known: {', '.join(sorted(INSTANCE_TYPES))}.")
        elif isinstance(usd, bool) or not isinstance(usd, (int, float)) or not 0 <= usd <= 10_000:
            errors.append(f"prices: {itype} must be USD per node-hour between 0 and 10000, got {usd!r}.")
    return errors
