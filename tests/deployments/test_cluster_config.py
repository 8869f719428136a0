"""A cluster's config is one typed dataclass per kind (deployments.cluster_config): its defaults are declared there
once, and every driver, check and report reads the parsed config, never the stored JSON with a default of its own."""
import re

from deployments.cluster_config import EksConfig, KubernetesConfig
from tests.deployments.test_one_source import APPS, ROOT
from tests.factories import ClusterFactory, DeploymentFactory, TeamFactory
from workers.targets.eks import EksTarget
from workers.targets.eks_ec2 import efa_security_group_name

EKS = {"region": "us-west-2", "cluster_name": "gpu-prod", "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
       "subnet_ids": ["subnet-0123456789abcdef0"]}
# The stored JSON, read by key: `cluster.config`, `c.config`, and `.config.get(` / `.config[` on anything.
RAW_READ = re.compile(r"\b(?:cluster|c)\.config\b(?!_typed)|\.config(?:\.get\(|\[)")
# Its writers (the service that registers and edits clusters, `tandem_local`'s setup) and the parser itself.
WRITERS = {"deployments/services/clusters.py", "deployments/local_setup.py", "deployments/cluster_config.py"}


def test_no_reader_reads_a_clusters_stored_config_by_key():
    found = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel in WRITERS or rel.startswith("gateway/"):  # gateway: its own config
                continue
            found += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                      if RAW_READ.search(line)]
    assert found == [], "read the cluster's config through `cluster.config_typed` (deployments.cluster_config)"


def test_settings_left_out_are_read_as_the_defaults_declared_once(db):
    cluster = ClusterFactory(kind="eks", config=EKS)
    typed = cluster.config_typed
    assert typed == EksConfig(**{**EKS, "subnet_ids": tuple(EKS["subnet_ids"])})
    assert (typed.namespace_prefix, typed.nodegroup_prefix, typed.capacity_type,
            typed.provisioning_deadline_minutes) == ("tandem-", "tandem-", "ON_DEMAND", 45)
    d = DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster)
    target = EksTarget(cluster)
    assert target.namespace(d) == "tandem-ml-research"
    assert efa_security_group_name(cluster) == "tandem-efa"

    cluster.config = {**EKS, "namespace_prefix": "gpu-", "nodegroup_prefix": "prod-"}
    assert (target.namespace(d), efa_security_group_name(cluster)) == ("gpu-ml-research", "prod-efa")
    assert ClusterFactory(name="k", kind="kubernetes", config={}).config_typed == KubernetesConfig()


def test_a_kubeconfig_context_that_is_not_a_name_is_refused_naming_the_field(api, platform_admin):
    api.force_authenticate(platform_admin)
    body = {"name": "k8s-prod", "kind": "kubernetes", "config": {"context": 5}}
    r = api.post("/api/v1/clusters/", body, format="json")
    assert r.status_code == 400
    assert r.json()["errors"]["config"] == ["context: the name of a context in the cluster's kubeconfig."]
    r = api.post("/api/v1/clusters/", {**body, "config": {"context": "prod-admin@gpu"}}, format="json")
    assert r.status_code == 201, r.json()
