"""The nodes of an EKS cluster's managed node groups, as EKS makes them, for the emulated API server of that cluster.

moto's server runs in the test process (tests/support/moto_server.py), so its EKS backend holds the node groups the
eks driver asked for: `EksNodes` turns each that is ACTIVE or UPDATING into `desiredSize` nodes (a group still
CREATING, or DELETING, CREATE_FAILED or DEGRADED, has none here), each as its kubelet and EKS register it:

- of the group's instance type (its launch template's, where the template names one), with the kubelet's
  allocatable for that type (tests/support/scheduler.py: EC2's figures, EKS AL2023's reserves and pod slots), less
  what the hugepages of the group's user data set aside (`vm.nr_hugepages = N` in its launch template);
- labelled as EKS labels managed node group nodes (EKS user guide, "Managed node groups": `eks.amazonaws.com/
  nodegroup`, `eks.amazonaws.com/capacityType`, `eks.amazonaws.com/sourceLaunchTemplateId`/`Version`, and
  `eks.amazonaws.com/nodegroup-image` where the template names the AMI) with the kubelet's and the cloud provider's
  well-known labels (hostname,
  instance type, os, arch, region, zone of its subnet) and the group's own labels;
- tainted with the group's taints, from EKS's API form (`NO_SCHEDULE` → `NoSchedule`, ...);
- carrying the DaemonSets docs/install.md leaves on every node that they select and tolerate
  (tests/support/eks_daemonsets.py): their requests are taken from the node before any Ray pod asks, and a node
  advertises `nvidia.com/gpu` only where the NVIDIA device plugin runs, and `vpc.amazonaws.com/efa` (one per EFA
  interface its launch template attaches) only where the EFA device plugin runs.

A node keeps its name, and what pods use of it, for as long as its group has it.
"""
import base64
import email
import re
from decimal import Decimal

from moto.core import DEFAULT_ACCOUNT_ID

from tests.support.eks_daemonsets import EFA_PLUGIN, NVIDIA_PLUGIN, daemonsets_on, requested
from tests.support.scheduler import MI, Node, instance, kubelet_allocatable

SERVING = ("ACTIVE", "UPDATING")  # node group statuses whose nodes exist and run pods
EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
HUGEPAGES = re.compile(r"vm\.nr_hugepages\s*=\s*(\d+)")
# The node group docs/install.md adds for the Ray heads ("The Ray heads' nodes").
SYSTEM_NODEGROUP = {"nodegroupName": "system", "instanceTypes": ["m5.2xlarge"],
                    "scalingConfig": {"minSize": 2, "maxSize": 4, "desiredSize": 2}}


class EksNodes:
    """The nodes of moto's EKS cluster `cluster_name` in `region`, read afresh on every call."""

    def __init__(self, *, region: str, cluster_name: str):
        self.region, self.cluster_name = region, cluster_name
        self._known: dict[str, Node] = {}  # node name -> the node, so what pods use of it is kept
        self._serials: dict[str, int] = {}  # node group uuid -> the number its nodes' addresses carry

    def nodes(self) -> list[Node]:
        """Every node of every ACTIVE or UPDATING managed node group of the cluster, now."""
        from moto.eks.models import eks_backends

        cluster = eks_backends[DEFAULT_ACCOUNT_ID][self.region].clusters.get(self.cluster_name)
        groups = [] if cluster is None else list(cluster.nodegroups.values())
        found = {}
        for group in groups:
            if group.status not in SERVING:
                continue
            serial = self._serials.setdefault(group.uuid, len(self._serials) + 1)
            template = self._template(group)
            for i in range(int(group.scaling_config.get("desiredSize", 0))):
                name = f"ip-10-{serial // 250}-{serial % 250}-{i + 10}.{self.region}.compute.internal"
                found[name] = self._known.get(name) or self._node(name, group, template, index=i)
        self._known = found
        return list(found.values())

    def _template(self, group) -> dict:
        """The launch template version's data the group runs on ({} for none, or for one since deleted)."""
        from moto.ec2.models import ec2_backends

        spec = group.launch_template or {}
        templates = ec2_backends[DEFAULT_ACCOUNT_ID][self.region].launch_templates
        if spec.get("id") not in templates:
            return {}
        return templates[spec["id"]].get_version(spec.get("version") or "$Default").data

    def _zone(self, group, index: int) -> str:
        from moto.ec2.models import ec2_backends

        subnets = ec2_backends[DEFAULT_ACCOUNT_ID][self.region].subnets
        wanted = group.subnets[index % len(group.subnets)] if group.subnets else ""
        return next((s.availability_zone for zone in subnets.values() for s in zone.values() if s.id == wanted),
                    f"{self.region}a")

    def _node(self, name: str, group, template: dict, *, index: int) -> Node:
        instance_type = template.get("InstanceType") or group.instance_types[0]
        shape = instance(instance_type)
        labels = {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": shape.arch,
            "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/region": self.region,
            "topology.kubernetes.io/zone": self._zone(group, index),
            "eks.amazonaws.com/nodegroup": group.nodegroup_name, "eks.amazonaws.com/capacityType": group.capacity_type,
            **({"eks.amazonaws.com/nodegroup-image": template["ImageId"]} if template.get("ImageId") else {}),
            **({"eks.amazonaws.com/sourceLaunchTemplateId": group.launch_template["id"],
                "eks.amazonaws.com/sourceLaunchTemplateVersion": str(group.launch_template.get("version", ""))}
               if group.launch_template and group.launch_template.get("id") else {}),
            **(group.labels or {})}
        taints = [{"key": t["key"], **({"value": t["value"]} if t.get("value") is not None else {}),
                   "effect": EFFECTS[t["effect"]]} for t in group.taints or []]
        pages = hugepages(template)
        allocatable = kubelet_allocatable(shape, Decimal(pages * 2 * MI))
        daemonsets = daemonsets_on(labels=labels, taints=taints)
        if NVIDIA_PLUGIN in daemonsets and shape.gpus:
            allocatable["nvidia.com/gpu"] = Decimal(shape.gpus)
        if EFA_PLUGIN in daemonsets and (efa := efa_interfaces(template)):
            allocatable["vpc.amazonaws.com/efa"] = Decimal(efa)
        return Node(name=name, labels=labels, taints=taints, allocatable=allocatable, used=requested(daemonsets))


def hugepages(template: dict) -> int:
    """The 2 MiB hugepages a launch template's user data reserves (`vm.nr_hugepages = N` in a shell script part)."""
    if not (data := template.get("UserData")):
        return 0
    text = data.decode() if hasattr(data, "decode") else base64.b64decode(data).decode()  # moto keeps it wrapped
    message = email.message_from_string(text)
    parts = message.get_payload() if message.is_multipart() else [message]
    return max([int(m) for part in parts if part.get_content_type() == "text/x-shellscript"
                for m in HUGEPAGES.findall(part.get_payload())] or [0])


def efa_interfaces(template: dict) -> int:
    """The EFA devices an instance of a launch template has: one per interface of type efa or efa-only."""
    return sum(1 for nic in template.get("NetworkInterfaces") or [] if nic.get("InterfaceType") in ("efa", "efa-only"))


def eks_emulated(aws, emulator, *, name: str = "gpu-prod", region: str = "us-west-2", zones: tuple[str, ...] = ("a",),
                 public: bool = False, system: bool = True) -> dict:
    """An EKS cluster in moto whose API server is `emulator`, as a platform team has it before registering it with
    Tandem (eks_cluster_create), with the system node group docs/install.md adds for the Ray heads (two m5.2xlarge,
    ACTIVE), its API server taking only EKS tokens, and its nodes those of its node groups."""
    import boto3

    from tests.support.moto_server import eks_cluster_create  # moto's server: not for the emulator's own process

    made = eks_cluster_create(url=aws.url, name=name, region=region, zones=zones, public=public)
    emulator.token, emulator.token_prefix = None, "k8s-aws-v1."
    emulator.eks = EksNodes(region=region, cluster_name=name)
    if system:
        eks = boto3.client("eks", region_name=region, endpoint_url=aws.url)
        eks.create_nodegroup(clusterName=name, subnets=made["subnet_ids"],
                             nodeRole="arn:aws:iam::123456789012:role/system-nodes", **SYSTEM_NODEGROUP)
        eks.get_waiter("nodegroup_active").wait(clusterName=name, nodegroupName="system",
                                               WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
    return made
