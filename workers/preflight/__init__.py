"""The preflight: what a real cluster must have before a deployment on it can serve, each check a line with pass or
fail, the evidence read from the cluster (or AWS), and the fix.

It reads only, through the same clients the drivers use (the worker's Kubernetes credentials and AWS identity), so
what it sees is what a deployment will meet. Checks of the Kubernetes side run on `eks` and `kubernetes` clusters;
the AWS side (IAM, subnets, the EFA security group, the node-group quota, where the GPU instance types are offered,
the vCPU quotas, the runtime images in ECR) on `eks` only. docs/install.md is the list of steps that make every
check pass.

A check that cannot be decided here says so (`unverified`) rather than passing: e.g. IAM's policy simulator where
the AWS endpoint does not offer it.
"""
import logging

from deployments.models import ClusterCheck
from deployments.services.cluster_checks import cluster_check_record
from workers.preflight.aws import DRIVER_ACTIONS, AwsChecks
from workers.preflight.kubernetes import (HEAD_NODES_FIX, HELM_EFA, HELM_NVIDIA, METRICS_APISERVICE, KubernetesChecks,
                                         kuberay_needed)
from workers.preflight.lines import FAIL, PASS, UNVERIFIED, CheckLine, Unreadable
from workers.preflight.runtime_images import RuntimeImageChecks
from workers.preflight.scheduling import node_admits, taint_tolerated
from workers.targets.base import PermanentError, TransientError
from workers.targets.eks import EksTarget
from workers.targets.kubernetes import KubernetesTarget

log = logging.getLogger(__name__)
__all__ = ["DRIVER_ACTIONS", "FAIL", "HEAD_NODES_FIX", "HELM_EFA", "HELM_NVIDIA", "METRICS_APISERVICE", "PASS", "UNVERIFIED", "CheckLine",
           "Preflight", "cluster_check_run", "cluster_preflight", "kuberay_needed", "node_admits", "taint_tolerated"]


class Preflight(KubernetesChecks, AwsChecks, RuntimeImageChecks):
    """Runs every check that applies to a cluster's kind; each check is a method returning its CheckLine (or, where
    it judges several subjects, one line for each)."""

    def __init__(self, target: KubernetesTarget):
        self.target = target
        self.cluster = target.cluster
        self.is_eks = isinstance(target, EksTarget)

    def run(self) -> list[CheckLine]:
        checks = [self.kuberay_operator, self.kuberay_crd, self.nvidia_device_plugin, self.efa_device_plugin,
                  self.allocatable, self.ray_head, self.metrics_server, self.team_namespaces]
        if self.is_eks:
            checks += [self.driver_iam, self.node_role_iam, self.subnets, self.efa_security_group,
                       self.nodegroup_quota, self.instance_offerings, self.vcpu_quotas, self.runtime_images,
                       self.vpc_cni]
        lines = []
        for check in checks:
            name = check.__name__.replace("_", "-")
            try:
                found = check()  # a check about several subjects gives a line for each
                lines += found if isinstance(found, list) else [found]
            except (Unreadable, PermanentError, TransientError) as e:
                lines.append(CheckLine(name, FAIL, str(e), "Fix what the evidence names, then run the checks again."))
        return lines


def cluster_preflight(cluster, *, api=None) -> list[CheckLine]:
    """Every check that applies to this cluster, in order (a Ray cluster has none: it is not Kubernetes)."""
    if cluster.kind == "ray":
        return []
    target = EksTarget(cluster, api=api) if cluster.kind == "eks" else KubernetesTarget(cluster, api=api)
    return Preflight(target).run()


def cluster_check_run(*, check_id: int) -> None:
    """Run a requested preflight and record it; a failure of the run itself is recorded as its error."""
    run = ClusterCheck.objects.select_related("cluster").get(pk=check_id)
    if run.status != ClusterCheck.Status.RUNNING:
        return  # a redelivered message: the run is recorded already
    try:
        lines = [line.to_dict() for line in cluster_preflight(run.cluster)]
    except (PermanentError, TransientError) as e:
        cluster_check_record(check_id=check_id, lines=[], error=str(e))
        return
    except Exception as e:  # a bug or an answer no check expected: the run ends, saying so, rather than stay running
        log.exception("the preflight of cluster %s failed", run.cluster.name)
        cluster_check_record(check_id=check_id, lines=[], error=f"The checks stopped on an unexpected error "
                                                               f"({type(e).__name__}); see the worker's log.")
        return
    cluster_check_record(check_id=check_id, lines=lines)
