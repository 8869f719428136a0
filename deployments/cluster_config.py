"""What each kind of cluster needs in its (non-secret) config."""
import re

from deployments.catalog import INSTANCE_TYPES
from deployments.model_sources import model_sources_errors
from deployments.spec import dns_label_errors

AWS_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
URL = re.compile(r"^https?://[^\s/]+(/[^\s]*)?$")
PREFIX_MAX = 20  # a DNS-1123 label of at most this, then an optional '-' before the team or deployment name

KNOWN_KEYS = {
    "eks": {"region", "cluster_name", "role_arn", "nodegroup_prefix", "namespace_prefix", "aws_endpoint_url",
            "subnet_ids", "node_role_arn", "kubernetes_endpoint_url", "metrics_url", "prometheus_url",
            "model_sources", "prices"},
    "kubernetes": {"context", "namespace_prefix", "metrics_url", "prometheus_url", "model_sources", "prices"},
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
        maybe("role_arn", ROLE_ARN, "an IAM role ARN (arn:aws:iam::123456789012:role/name).")
        maybe("node_role_arn", ROLE_ARN, "the node group IAM role ARN.")
        maybe_prefix("nodegroup_prefix")
        maybe("aws_endpoint_url", URL, "an http(s) URL.")
        # Reach the API server through a tunnel or proxy instead of the endpoint EKS reports (and tests).
        maybe("kubernetes_endpoint_url", URL, "an http(s) URL.")
    if kind in ("eks", "kubernetes"):
        maybe_prefix("namespace_prefix")
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
