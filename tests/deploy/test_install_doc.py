"""docs/install.md's configuration step, run on a copy of deploy/: its `sed` edits and image pin leave no REPLACE
marker, and the result still renders and validates."""
import shutil
import subprocess

import kubernetes_validate
import yaml

from tests.deploy.render import ROOT

VALUES = {"PORTAL_HOST": "tandem.corp.example", "GATEWAY_HOST": "llm.corp.example", "AWS_ACCOUNT_ID": "123456789012",
          "CERT_ARN": "arn:aws:acm:us-east-1:123456789012:certificate/abc", "VPC_CIDR": "10.42.0.0/16",
          "IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/tandem", "TAG": "abc1234", "COMPANY": "Corp SSO",
          "OIDC_AUTHORIZE": "https://sso.corp.example/authorize", "OIDC_TOKEN": "https://sso.corp.example/token",
          "OIDC_USERINFO": "https://sso.corp.example/userinfo", "OIDC_JWKS": "https://sso.corp.example/jwks"}


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
                  "https://sso.corp.example/jwks"):
        assert value in out, value
