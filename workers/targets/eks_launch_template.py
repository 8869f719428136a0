"""What an EKS managed node group of Tandem's runs on: its EC2 launch template, as data.

Pure functions: the driver (workers.targets.eks) creates what they describe. EKS forbids some launch template
fields in managed node groups (botocore's `LaunchTemplateSpecification` documentation: no `SubnetId` in a network
interface, no `IamInstanceProfile`, no spot request, no hibernation or terminate behaviour); none of them appears
here. EKS wants the instance type in one place only: on the node group, except for a Capacity Block, whose template
holds it (the EKS user guide, "Create a managed node group with Capacity Blocks for ML").

What the instances launch with carries the pool's tags (`TagSpecifications` for instance, volume and
network-interface, the resource types a launch template may tag at launch), so GPU spend is attributable and an
orphan can be found by its tags.
"""
import base64
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from email.mime.text import MIMEText

from deployments.catalog import InstanceType
from deployments.manifests import EFA_HUGEPAGES
from deployments.yamlio import yaml_dump

LAUNCH_TAGGED = ("instance", "volume", "network-interface")
# IMDSv2 with one hop: the node itself (kubelet, and the host-network DaemonSets: VPC CNI, device plugins) reaches
# the instance metadata, a pod on the pod network does not, so no pod can take the node role's credentials. Tandem's
# pods need none: their AWS access is their own role (IRSA). EKS's own default template allows two hops.
IMDS = {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
# The runtime image on disk: containerd keeps the compressed layers and the unpacked snapshot (the ray-llm CUDA
# images are about 15 GiB compressed), with room for the image of the next update beside it.
IMAGE_DISK_GIB = 80
ROOT_DEVICE = "/dev/xvda"  # the root device of EKS's AL2023 AMIs
OS_ROOT_GIB = 100  # the root volume when containerd and the kubelet live on the instance store
HUGEPAGE_MIB = 2
GIB_PER_GB = 10**9 / 2**30


def disk_needed_gib(instance: InstanceType) -> int:
    """The image plus the largest model the node can serve (its GPUs' memory: the weights are downloaded to local
    disk before they load), plus a tenth for logs and the kubelet."""
    return int((IMAGE_DISK_GIB + instance.gpus * instance.gpu_memory_gib) * 1.1) + 1


def uses_instance_store(instance: InstanceType) -> bool:
    """Whether the node's NVMe instance store can hold the image and weights (then it does, as RAID0)."""
    return instance.nvme_gb * GIB_PER_GB >= disk_needed_gib(instance)


def root_volume_gib(instance: InstanceType) -> int:
    """The root volume: the OS alone where the instance store takes images and pods, else image and weights too
    (EKS's default of 20 GiB holds neither)."""
    return OS_ROOT_GIB if uses_instance_store(instance) else max(OS_ROOT_GIB, disk_needed_gib(instance))


def hugepages_per_node() -> int:
    """2 MiB pages the node reserves: what the pod on it asks for (deployments.manifests.EFA_HUGEPAGES)."""
    return int(EFA_HUGEPAGES.removesuffix("Mi")) // HUGEPAGE_MIB


def user_data(instance: InstanceType) -> str | None:
    """The node's user data, base64, or None when it needs none: MIME multipart, as EKS requires when it merges
    its own bootstrap into a launch template's.

    - a nodeadm NodeConfig that puts the NVMe instance store together as RAID0 and moves containerd and the
      kubelet (images, pods' ephemeral storage) onto it (`spec.instance.localStorage.strategy`);
    - on EFA types, a script that reserves the hugepages before nodeadm starts the kubelet, which then reports
      them as allocatable."""
    parts = []
    if uses_instance_store(instance):
        config = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
                  "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}}}
        part = MIMENonMultipart("application", "node.eks.aws")
        part.set_payload("---\n" + yaml_dump(config, sort_keys=False))
        parts.append(part)
    if instance.has_efa:
        script = ("#!/bin/bash\nset -euo pipefail\n"
                  f"echo 'vm.nr_hugepages = {hugepages_per_node()}' > /etc/sysctl.d/90-tandem-hugepages.conf\n"
                  "sysctl --system\n")
        parts.append(MIMEText(script, "x-shellscript"))
    if not parts:
        return None
    message = MIMEMultipart(boundary="//TANDEM//")
    for part in parts:
        message.attach(part)
    return base64.b64encode(message.as_bytes()).decode()


def efa_interfaces(instance: InstanceType, security_group_ids: list[str]) -> list[dict]:
    """One EFA device per network card: on card 0 the instance's primary interface, `efa` (EFA with ENA: it carries
    the node's IP address), on every other card an `efa-only` one, at device index 1, which takes no IP address
    (EC2 user guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards" and its P5
    section; EKS user guide, "EFA and EFA-only interfaces": card 0 cannot be EFA-only, and EFA-only interfaces need
    the VPC CNI 1.18.5 or later, which the preflight's `vpc-cni` line checks). A p5.48xlarge so takes one subnet IP
    for its 32 EFA devices, not 32."""
    return [{"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1,
             "InterfaceType": "efa" if card == 0 else "efa-only", "Groups": list(security_group_ids),
             "DeleteOnTermination": True}
            for card in range(instance.efa_interfaces)]


def launch_template_data(*, instance: InstanceType, security_group_ids: list[str], placement_group: str | None,
                         capacity_reservation_id: str | None, capacity_block: bool, tags: dict[str, str]) -> dict:
    """`LaunchTemplateData` for one pool's node group.

    EFA types get one EFA interface per network card (`efa_interfaces`), the security groups on each interface
    (EKS does not add its cluster security group to a template that names its own), and the placement group the
    driver chose (none around a reservation that is not in it). A reservation is targeted; a Capacity Block also
    names its market type and the instance type. Every type gets disk for the image and weights (its instance store
    as RAID0, or a root volume), IMDSv2 with one hop, and `tags` on what it launches."""
    data: dict = {
        "BlockDeviceMappings": [{"DeviceName": ROOT_DEVICE, "Ebs": {
            "VolumeSize": root_volume_gib(instance), "VolumeType": "gp3", "DeleteOnTermination": True,
            "Encrypted": True}}],
        "MetadataOptions": dict(IMDS),
        "TagSpecifications": [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                              for kind in LAUNCH_TAGGED],
    }
    if (text := user_data(instance)) is not None:
        data["UserData"] = text
    if instance.has_efa:
        data["NetworkInterfaces"] = efa_interfaces(instance, security_group_ids)
    if placement_group:
        data["Placement"] = {"GroupName": placement_group}
    if capacity_reservation_id:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}}
    if capacity_block:
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        data["InstanceType"] = instance.name
    return data
