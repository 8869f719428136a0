"""What an EKS managed node group of Tandem's runs on: its EC2 launch template, as data.

Pure functions: the driver (workers.targets.eks) creates what they describe. EKS forbids some launch template
fields in managed node groups (botocore's `LaunchTemplateSpecification` documentation: no `SubnetId` in a network
interface, no `IamInstanceProfile`, no spot request, no hibernation or terminate behaviour); none of them appears
here. Instance types are named on the node group, not in the template (EKS wants them in one place only).
"""
import base64
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from deployments.catalog import InstanceType
from deployments.manifests import EFA_HUGEPAGES

# The runtime image on disk: containerd keeps the compressed layers and the unpacked snapshot (the ray-llm CUDA
# images are about 15 GiB compressed), with room for the image of the next update beside it.
IMAGE_DISK_GIB = 80
ROOT_DEVICE = "/dev/xvda"  # the root device of EKS's AL2023 AMIs
HUGEPAGE_MIB = 2


def root_volume_gib(instance: InstanceType) -> int:
    """The root volume: the image plus the largest model the node can serve (its GPUs' memory, whose weights are
    downloaded to local disk before they load), plus a tenth for logs and the kubelet. EKS's default is 20 GiB."""
    weights = instance.gpus * instance.gpu_memory_gib
    return int((IMAGE_DISK_GIB + weights) * 1.1) + 1


def hugepages_per_node() -> int:
    """2 MiB pages the node reserves: what the pod on it asks for (deployments.manifests.EFA_HUGEPAGES)."""
    return int(EFA_HUGEPAGES.removesuffix("Mi")) // HUGEPAGE_MIB


def user_data(*, hugepages: int) -> str:
    """The node's user data, base64: MIME multipart, as EKS requires when it merges its own bootstrap into a
    launch template's. The script reserves the hugepages before nodeadm starts the kubelet, which then reports
    them as allocatable."""
    message = MIMEMultipart(boundary="//TANDEM//")
    script = ("#!/bin/bash\nset -euo pipefail\n"
              f"echo 'vm.nr_hugepages = {hugepages}' > /etc/sysctl.d/90-tandem-hugepages.conf\n"
              "sysctl --system\n")
    message.attach(MIMEText(script, "x-shellscript"))
    return base64.b64encode(message.as_bytes()).decode()


def launch_template_data(*, instance: InstanceType, security_group_ids: list[str], placement_group: str | None,
                         capacity_reservation_id: str | None, capacity_block: bool) -> dict:
    """`LaunchTemplateData` for one pool's node group.

    EFA types get one EFA interface per network card (`efa_interfaces` in the catalog; the primary on card 0 at
    device 0, the others at device 1, as AWS's EFA guide lays them out), the security groups on each interface
    (EKS does not add its cluster security group to a template that names its own), and the cluster placement
    group. Every type gets a root volume sized for the image and weights."""
    data: dict = {
        "BlockDeviceMappings": [{"DeviceName": ROOT_DEVICE, "Ebs": {
            "VolumeSize": root_volume_gib(instance), "VolumeType": "gp3", "DeleteOnTermination": True,
            "Encrypted": True}}],
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2},
    }
    if instance.has_efa:
        data["NetworkInterfaces"] = [
            {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
             "Groups": list(security_group_ids), "DeleteOnTermination": True}
            for card in range(instance.efa_interfaces)]
        data["UserData"] = user_data(hugepages=hugepages_per_node())
    if placement_group:
        data["Placement"] = {"GroupName": placement_group}
    if capacity_reservation_id:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}}
    if capacity_block:
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return data
