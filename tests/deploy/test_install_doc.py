"""docs/install.md against the code: its cluster add-ons step tolerates the taints the eks target sets and runs the
commands the preflight names as fixes; its configuration step, run on a copy of deploy/, leaves no REPLACE marker,
and the result still renders and validates."""
import json
import re
import shutil
import subprocess

import kubernetes_validate
import yaml
from packaging.version import Version

from deployments.catalog import INSTANCE_TYPES
from deployments.manifests import POOL_LABEL
from tests.deploy.render import ROOT
from workers.preflight import (HEAD_NODES_FIX, HELM_EFA, HELM_NVIDIA, METRICS_APISERVICE, kuberay_needed, node_admits,
                               taint_tolerated)
from workers.targets.eks import nodegroup_taints

VALUES = {"PORTAL_HOST": "tandem.corp.example", "GATEWAY_HOST": "llm.corp.example", "AWS_ACCOUNT_ID": "123456789012",
          "CERT_ARN": "arn:aws:acm:us-east-1:123456789012:certificate/abc", "VPC_CIDR": "10.42.0.0/16",
          "ALB_SUBNET_CIDRS": "10.42.0.0/20,10.42.16.0/20",
          "IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/tandem", "TAG": "abc1234", "COMPANY": "Corp SSO",
          "OIDC_AUTHORIZE": "https://sso.corp.example/authorize", "OIDC_TOKEN": "https://sso.corp.example/token",
          "OIDC_USERINFO": "https://sso.corp.example/userinfo", "OIDC_JWKS": "https://sso.corp.example/jwks",
          "OIDC_ISSUER_URL": "https://sso.corp.example"}


def test_the_documented_edits_fill_every_placeholder(tmp_path):
    doc = (ROOT / "docs" / "install.md").read_text()
    section = doc.split("## 6.", 1)[1].split("## 7.", 1)[0]
    edits = [line for line in section.splitlines() if line.startswith("sed -i ")]
    assert len(edits) >= 7
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "deploy/overlays/eks/global-bundle.pem").write_text("-----BEGIN CERTIFICATE-----\n...\n")
    subprocess.run(["bash", "-euc", "\n".join(edits)], cwd=tmp_path, check=True,
                   env={"PATH": "/usr/bin:/bin", **VALUES})
    left = subprocess.run(["grep", "-rn", "^[^#]*REPLACE", "deploy/overlays/eks"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert left.stdout == ""
    out = subprocess.run(["kubectl", "kustomize", "deploy/overlays/eks"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.31", strict=True)
    web = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "tandem-web")
    assert web["spec"]["template"]["spec"]["containers"][0]["image"] == f"{VALUES['IMAGE']}:{VALUES['TAG']}"
    for value in ("tandem.corp.example", "llm.corp.example", "10.42.0.0/16", "Corp SSO",
                  "https://sso.corp.example/jwks", "TANDEM_OIDC_ISSUER: https://sso.corp.example\n"):
        assert value in out, value


# --- section 1: the cluster add-ons the preflight checks, against what the code sets --------------------------
def _section_one() -> str:
    doc = (ROOT / "docs" / "install.md").read_text()
    return doc.split("## 1.", 1)[1].split("## 2.", 1)[0]


def _values(name: str) -> dict:
    return yaml.safe_load((ROOT / "deploy" / "cluster" / name).read_text())


def _tandem_nodes(*, efa_only: bool):
    """(instance type, labels, taints) of a node of each GPU node group Tandem makes, as the eks target sets them."""
    for name, instance in INSTANCE_TYPES.items():
        if instance.gpus and (instance.has_efa or not efa_only):
            taints = [{"key": t["key"], "value": t["value"], "effect": {"NO_SCHEDULE": "NoSchedule"}[t["effect"]]}
                      for t in nodegroup_taints(instance)]
            yield name, {"node.kubernetes.io/instance-type": name, POOL_LABEL: "prefill"}, taints


def test_the_documented_device_plugin_values_tolerate_every_taint_the_eks_target_sets():
    nvidia, efa = _values("nvidia-device-plugin-values.yaml"), _values("efa-device-plugin-values.yaml")
    for values, efa_only in ((nvidia, False), (efa, True)):
        for itype, _, taints in _tandem_nodes(efa_only=efa_only):
            assert taints and all(taint_tolerated(t, values["tolerations"]) for t in taints), itype
    # and the NVIDIA plugin runs on Tandem's nodes, asking for no Node Feature Discovery label
    for itype, labels, _ in _tandem_nodes(efa_only=False):
        assert node_admits(nvidia, labels), itype
    assert "feature.node.kubernetes.io" not in json.dumps(nvidia)
    assert not node_admits(nvidia, {"node.kubernetes.io/instance-type": "p5.48xlarge"})  # not other people's nodes


def test_the_documented_commands_are_the_preflights_fixes():
    section = _section_one()
    assert HELM_NVIDIA in section and HELM_EFA in section and HEAD_NODES_FIX in section
    kuberay = re.search(r"helm upgrade --install kuberay-operator kuberay/kuberay-operator --version (\S+)", section)
    crd = re.search(r"ray-operator/config/crd\?ref=v(\S+?)'", section)
    assert kuberay and crd and kuberay[1] == crd[1]
    assert Version(kuberay[1]) >= kuberay_needed("eks")
    assert METRICS_APISERVICE in section
    doc = (ROOT / "docs" / "install.md").read_text()
    assert "tandemctl doctor $CLUSTER_NAME" in doc and "subnet_ids\\\": $NODE_SUBNETS" in doc


def test_the_documented_node_group_names_are_the_ones_the_eks_target_makes():
    """The doc names node groups as EksTarget.nodegroup_name makes them (a stale name sends people looking for
    groups that do not exist, and to the wrong IAM resource pattern)."""
    doc = (ROOT / "docs" / "install.md").read_text()
    named = re.search(r"Node groups are named `tandem-(.+?)-prefill\|decode`", doc)
    source = (ROOT / "workers" / "targets" / "eks.py").read_text()
    assert named and named[1] == "d<deployment id>"
    assert 'name = f"{prefix}d{deployment.pk}-{stage}"' in source
