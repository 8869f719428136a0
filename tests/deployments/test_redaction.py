"""What members and key holders read names a cluster, not its internal addresses, ARNs, subnets or secret files."""
import orjson
import pytest

from deployments.models import Cluster
from deployments.redaction import internal_redact
from gateway.errors import from_upstream

EKS = Cluster(name="shared-gpu", kind="eks", secret_ref="file:/etc/tandem/secrets/eks-prod-token",
              config={"region": "us-west-2", "cluster_name": "prod",
                      "role_arn": "arn:aws:iam::123456789012:role/tandem-prod",
                      "subnet_ids": ["subnet-0abc1234def567890"],
                      "kubernetes_endpoint_url": "https://k8s.internal.example:6443"})
RAY = Cluster(name="local", kind="ray", secret_ref="env:TANDEM_CLUSTER_RAY_TOKEN",
              config={"dashboard_url": "http://ray-head.corp:8265"})


@pytest.mark.parametrize("cluster,text,hidden,shown", [
    (RAY, "http://ray-head.corp:8000/v1/models answered 502.", "ray-head.corp", "[an address on cluster local]"),
    (RAY, "ray-head.corp:8265 refused the connection", "ray-head.corp", "[cluster local]"),
    (RAY, "The variable TANDEM_CLUSTER_RAY_TOKEN is not set.", "TANDEM_CLUSTER_RAY_TOKEN", "[cluster local]"),
    (EKS, "Cannot read /etc/tandem/secrets/eks-prod-token", "eks-prod-token", "[cluster shared-gpu]"),
    (EKS, "AccessDenied assuming arn:aws:iam::123456789012:role/tandem-prod", "123456789012",
     "[a role on cluster shared-gpu]"),
    (EKS, "no capacity in subnet-0abc1234def567890", "subnet-0abc", "[a network of cluster shared-gpu]"),
    (EKS, "replica on 10.0.3.7:8000 died", "10.0.3.7", "[an address on cluster shared-gpu]"),
    (None, "upstream http://10.0.3.7:8000/v1 reset", "10.0.3.7", "[an address on the cluster]"),
])
def test_internals_become_the_cluster_name(cluster, text, hidden, shown):
    out = internal_redact(text, cluster=cluster)
    assert hidden not in out and shown in out


def test_the_users_own_model_source_is_kept():
    text = "The model source s3://team-models/llama does not exist."
    assert internal_redact(text, cluster=RAY) == text


def test_a_gateway_error_from_upstream_hides_internal_addresses():
    body = orjson.dumps({"detail": "Could not reach http://10.0.3.7:8000/prefill (replica ray-node-3)"})
    error = from_upstream(500, body)
    assert error.status == 502 and "10.0.3.7" not in error.message and "an address on the cluster" in error.message


def test_a_short_host_name_is_replaced_only_as_a_whole_word():
    cluster = Cluster(name="edge", kind="ray", config={"dashboard_url": "http://prod:8265"})
    assert internal_redact("production traffic reached prod:8265 and prod", cluster=cluster) == \
        "production traffic reached [cluster edge] and [cluster edge]"
