"""`tandemctl doctor` as a platform admin runs it: a subprocess against the real web process, a real Celery worker
running the preflight against an emulated EKS cluster (the Kubernetes API emulator holding the add-ons as a real
cluster holds them, tests/support/cluster_addons.py; moto's EC2, EKS, IAM and STS through real boto3)."""
import json

import httpx
import pytest
from kubernetes import client as k8s

from deployments.models import AccessToken, Cluster, ClusterCheck
from deployments.services.credentials import credential_mint
from tandemctl import errors
from tests.factories import TeamFactory, UserFactory
from tests.support import cluster_addons
from tests.support.processes import Worker, start_web, wait_for, worker_environment
from tests.support.tandemctl import tandemctl
from tests.workers.conftest import aws, moto  # noqa: F401 - the moto server and its reset, as the driver tests use them


@pytest.fixture
def stack(aws, emulator, transactional_db, redis_client, tmp_path):
    """The web process and a worker; a platform admin's token; EKS cluster gpu-prod with node subnets in two zones."""
    cluster_addons.install_kinds(emulator)
    emulator.install_kuberay()
    emulator.token, emulator.token_prefix = None, "k8s-aws-v1."
    TeamFactory(slug="ml-research")
    admin = UserFactory(username="platform", is_staff=True, is_superuser=True)
    network = cluster_addons.aws_network(aws.url, zones=("a", "b"))
    image = cluster_addons.runtime_image_manifest()  # the runtime image built and pushed (docs/install.md, 5)
    cluster_addons.runtime_image_push(aws.url, image)
    web = start_web(tmp_path)
    worker = Worker(worker_environment(tmp_path)).start()
    try:
        yield {"server": web.base_url, "token": credential_mint(model=AccessToken, user=admin, name="ci")[1],
               "subnets": network["subnets"], "aws": aws, "emulator": emulator, "image": image}
    finally:
        worker.stop()
        web.stop()


def _register(stack, name: str, subnets: list[str]) -> None:
    config = {"region": cluster_addons.REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": stack["aws"].url,
              "kubernetes_endpoint_url": stack["emulator"].base_url,
              "node_role_arn": "arn:aws:iam::123456789012:role/nodes", "subnet_ids": subnets,
              "runtime_images": {"ray-2.60.0-vllm-0.29.0": cluster_addons.runtime_image_ref(stack["image"])}}
    r = httpx.post(f"{stack['server']}/api/v1/clusters/", json={"name": name, "kind": "eks", "config": config},
                   headers={"Authorization": f"Bearer {stack['token']}"}, timeout=30)
    assert r.status_code == 201, r.text


@pytest.mark.e2e
def test_doctor_prints_three_failures_with_their_fixes_then_all_pass_once_installed_as_documented(stack, tmp_path):
    cli = dict(token=stack["token"], server=stack["server"], home=tmp_path)
    api = cluster_addons.emulator_client(stack["emulator"])
    # What docs/install.md used to install: KubeRay, the NVIDIA chart with its defaults, metrics-server; no EFA plugin.
    # The cluster's own nodes (an m5.2xlarge node group) hold a Ray head; EKS installed its VPC CNI.
    cluster_addons.system_node(api, name="system-1", instance_type="m5.2xlarge", allocatable=cluster_addons.M5_2XLARGE)
    cluster_addons.vpc_cni(api)
    cluster_addons.kuberay(api, version="1.5.1")
    cluster_addons.nvidia_device_plugin(api, documented=False)
    cluster_addons.metrics_server(api)
    _register(stack, "eks-prod", stack["subnets"])
    # Registering ran the preflight in the worker.
    wait_for(lambda: ClusterCheck.objects.filter(cluster__name="eks-prod").exclude(status="running").exists(),
             timeout=60, what="the registration's preflight")
    assert ClusterCheck.objects.get(cluster__name="eks-prod").status == ClusterCheck.Status.FAILED

    run = tandemctl("doctor", "eks-prod", **cli, check_rc=errors.FAILED)
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == ["FAIL  nvidia-device-plugin", "FAIL  efa-device-plugin",
                                                      "FAIL  subnets"], run.stdout
    lines = run.stdout.splitlines()
    fixes = [lines[lines.index(line) + 1] for line in failed]
    assert all(fix.startswith("      fix: ") for fix in fixes), run.stdout
    assert "-f deploy/cluster/nvidia-device-plugin-values.yaml" in fixes[0]
    assert "-f deploy/cluster/efa-device-plugin-values.yaml" in fixes[1]
    assert f'subnet_ids ["{stack["subnets"][0]}"]' in fixes[2] or f'subnet_ids ["{stack["subnets"][1]}"]' in fixes[2]
    assert "eks-prod: 16 of 19 checks did not fail; 3 failed." in run.stdout

    # The fixes, as docs/install.md does them: the NVIDIA chart with Tandem's values, the EFA plugin, one zone.
    k8s.AppsV1Api(api).delete_namespaced_daemon_set("nvdp-nvidia-device-plugin", "kube-system")
    cluster_addons.nvidia_device_plugin(api, documented=True, ready=1)
    cluster_addons.efa_device_plugin(api, ready=1)
    cluster_addons.gpu_node(api, name="ip-10-0-1-17.us-west-2.compute.internal", instance_type="p5.48xlarge",
                            nodegroup="tandem-d1-prefill")
    # ... and the subnets fix applied to the cluster that was registered (the rest of its config stays).
    kept = stack["subnets"][:1]
    run = tandemctl("cluster", "set", "eks-prod", f"subnet_ids={json.dumps(kept)}", **cli, check_rc=errors.OK)
    assert "cluster eks-prod updated" in run.stderr
    assert Cluster.objects.get(name="eks-prod").config["subnet_ids"] == kept
    run = tandemctl("doctor", "eks-prod", **cli, check_rc=errors.OK)
    assert not [line for line in run.stdout.splitlines() if line.startswith("FAIL")], run.stdout
    assert "eks-prod: 19 of 19 checks did not fail." in run.stdout
    # moto cannot simulate IAM policies: the three IAM lines say so rather than pass.
    assert sorted(line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("????")) == \
        ["????  driver-iam", "????  node-role-iam", "????  runtime-image-pull"]


@pytest.mark.e2e
def test_only_platform_admins_run_the_checks(stack, tmp_path):
    member = UserFactory(username="member")
    token = credential_mint(model=AccessToken, user=member, name="ci")[1]
    _register(stack, "eks-prod", stack["subnets"][:1])
    run = tandemctl("doctor", "eks-prod", token=token, server=stack["server"], home=tmp_path, check_rc=errors.AUTH)
    assert "Only platform admins can check clusters." in run.stderr
    run = tandemctl("cluster", "set", "eks-prod", 'subnet_ids=["subnet-0aaa1111bbbb22223"]', token=token,
                    server=stack["server"], home=tmp_path, check_rc=errors.AUTH)
    assert "Only platform admins can edit clusters." in run.stderr
    assert Cluster.objects.get(name="eks-prod").config["subnet_ids"] == stack["subnets"][:1]
