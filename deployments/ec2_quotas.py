"""EC2's vCPU quotas of the instance families Tandem launches: which quota an instance type counts against, by the
node groups' capacity type (one place: the eks driver, the preflight and an approval's check subjects read it).

EC2 counts running instances per family bucket in vCPUs, against a Service Quotas quota of service `ec2`
(docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html, "On-Demand Instance quotas" and "Spot
Instance quotas"): P (p4d, p4de, p5, p5e, p5en) and G and VT (g5, g6, g6e) have a quota of their own each. The codes
are the quotas' own in Service Quotas (`aws service-quotas list-service-quotas --service-code ec2`); new accounts
get low values, often below one p5.48xlarge (192 vCPUs).
"""
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class VcpuQuota:
    """One EC2 vCPU quota: its Service Quotas code and name, and the family bucket it counts."""

    code: str
    name: str
    family: str


# (family, the node groups' capacityType) → quota. CAPACITY_BLOCK is absent: instances of a capacity block run in
# the reservation bought for them, which bounds them.
VCPU_QUOTAS: dict[tuple[str, str], VcpuQuota] = {
    ("P", "ON_DEMAND"): VcpuQuota("L-417A185B", "Running On-Demand P instances", "P"),
    ("P", "SPOT"): VcpuQuota("L-7212CCBC", "All P Spot Instance Requests", "P"),
    ("G", "ON_DEMAND"): VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances", "G"),
    ("G", "SPOT"): VcpuQuota("L-3819A6DF", "All G and VT Spot Instance Requests", "G"),
}
# An instance type's family letters (the name's part before the generation's digit) → its quota bucket.
FAMILY_BUCKETS = {"p": "P", "g": "G", "vt": "G"}


def quota_family(instance_type: str) -> str | None:
    """The vCPU quota bucket of an instance type ("P" for p5.48xlarge, "G" for g6e.xlarge), None for a type whose
    bucket Tandem does not check (CPU types, the local `cpu`)."""
    match = re.match(r"([a-z]+)\d", instance_type)
    return FAMILY_BUCKETS.get(match.group(1)) if match else None


def vcpu_quota(instance_type: str, capacity_type: str) -> VcpuQuota | None:
    """The quota a node group of this instance type and capacityType counts against, None where none is checked."""
    family = quota_family(instance_type)
    return VCPU_QUOTAS.get((family, capacity_type)) if family else None
