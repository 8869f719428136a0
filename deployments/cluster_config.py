"""What each kind of cluster needs in its (non-secret) config."""
import re

from deployments.catalog import INSTANCE_TYPES
from deployments.model_sources import model_sources_errors
from deployments.secret_refs import secret_ref_errors
from deployments.spec import dns_label_errors

AWS_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
URL = re.compile(r"^https?://[^\s/]+(/[^\s]*)?$")
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8,17}$")
RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")  # botocore's eks CapacityTypes
# Node groups not ACTIVE this long after provisioning began fail the deployment (`provisioning_deadline_minutes`).
PROVISIONING_DEADLINE_MINUTES = 45
PREFIX_MAX = 20  # a DNS-1123 label of at most this, then an optional '-' before the team or deployment name

KNOWN_KEYS = {
    "eks": {"region", "cluster_name", "role_arn", "nodegroup_prefix", "namespace_prefix", "aws_endpoint_url",
            "subnet_ids", "node_role_arn", "kubernetes_endpoint_url", "metrics_url", "prometheus_url",
            "model_sources", "prices", "capacity_type", "capacity_reservation_ids", "provisioning_deadline_minutes",
            "team_roles", "hf_token_refs"},
    "kubernetes": {"context", "namespace_prefix", "metrics_url", "prometheus_url", "model_sources", "prices",
                   "hf_token_refs"},
    "ray": {"dashboard_url", "serve_url", "metrics_url", "prometheus_url", "model_sources", "prices"},
}


def cluster_config_errors(kind: str | None, config: dict) -> list[str]:
    """Messages for a config this kind of cluster cannot use (empty when it is fine)."""
    if kind not in KNOWN_KEYS:
        return []  # the kind field reports its own error
    if not isinstance(config, dict):
        return ["Must be an object."]
    errors = [f"Unknown setting {k!r} for a {kind} cluster; known: {', '.join(sorted(KNOWN_KEYS[kind]))}."
              for k in config if k not in KNOWN_KEYS[kind]]

    def need(key, pattern, what):
        value = config.get(key)
        if not isinstance(value, str) or not pattern.match(value):
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
        errors += _eks_errors(config)
        maybe_prefix("nodegroup_prefix")
        maybe("aws_endpoint_url", URL, "an http(s) URL.")
        # Reach the API server through a tunnel or proxy instead of the endpoint EKS reports (and tests).
        maybe("kubernetes_endpoint_url", URL, "an http(s) URL.")
    if kind in ("eks", "kubernetes"):
        maybe_prefix("namespace_prefix")
        if "hf_token_refs" in config:  # each team's Hugging Face token, copied into its namespace (gated models)
            errors += hf_token_refs_errors(config["hf_token_refs"])
    if "model_sources" in config:  # where each team may load weights from (deployments.model_sources)
        errors += model_sources_errors(config["model_sources"])
    if "prices" in config:  # this cluster's USD per node-hour (reserved, spot) where it is not the on-demand price
        errors += prices_errors(config["prices"])
    maybe("prometheus_url", URL, "a Prometheus server's http(s) URL, e.g. http://prometheus:9090.")
    if kind in ("eks", "kubernetes"):
        maybe("metrics_url", URL, "the Ray head's metrics export URL, e.g. http://head:8080/metrics.")
    if kind == "ray":
        need("dashboard_url", URL, "the Ray dashboard's http(s) URL, e.g. http://127.0.0.1:8265.")
        maybe("serve_url", URL, "the Serve HTTP proxy's URL, e.g. http://127.0.0.1:8000.")
        maybe("metrics_url", URL, "the metrics export URL, e.g. http://127.0.0.1:8080/metrics.")
    return errors


def _eks_errors(config: dict) -> list[str]:
    """Subnets, capacity, deadline and team roles of an `eks` cluster."""
    errors = []
    subnets = config.get("subnet_ids")
    if not isinstance(subnets, list) or not subnets or not all(isinstance(s, str) and SUBNET_ID.match(s)
                                                                 for s in subnets):
        errors.append("subnet_ids: a list of private subnet ids (subnet-0123456789abcdef0) in one Availability Zone, "
                      "required: EKS creates no node group without subnets, and EFA and KV traffic do not cross "
                      "zones.")
    capacity = config.get("capacity_type", "ON_DEMAND")
    if capacity not in CAPACITY_TYPES:
        errors.append(f"capacity_type: one of {', '.join(CAPACITY_TYPES)}.")
    reservations = config.get("capacity_reservation_ids", {})
    if not isinstance(reservations, dict) or not all(
            t in INSTANCE_TYPES and isinstance(r, str) and RESERVATION_ID.match(r) for t, r in reservations.items()):
        errors.append("capacity_reservation_ids: an object of instance type → capacity reservation id "
                      "(cr-0123456789abcdef0), e.g. {\"p5.48xlarge\": \"cr-0123456789abcdef0\"}.")
    elif capacity == "CAPACITY_BLOCK" and not reservations:
        errors.append("capacity_reservation_ids: CAPACITY_BLOCK needs the capacity block's reservation id for each "
                      "instance type Tandem may launch on it.")
    deadline = config.get("provisioning_deadline_minutes", PROVISIONING_DEADLINE_MINUTES)
    if isinstance(deadline, bool) or not isinstance(deadline, int) or not 5 <= deadline <= 24 * 60:
        errors.append("provisioning_deadline_minutes: whole minutes between 5 and 1440.")
    roles = config.get("team_roles", {})
    if not isinstance(roles, dict) or not all(isinstance(t, str) and not dns_label_errors(t) and isinstance(r, str)
                                              and ROLE_ARN.match(r) for t, r in roles.items()):
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
