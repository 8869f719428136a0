"""An AWS account's limits as AWS answers them, in front of moto (tests/support/moto_server.py): where EC2 offers each
instance type, the EC2 vCPU quotas in Service Quotas, and what an Auto Scaling group's launches meet when a node
group passes either.

What moto 5.2.5 does, and what is answered here instead:
- EC2 `DescribeInstanceTypeOfferings`: moto answers from AWS's own offerings per zone, recorded in its data
  (moto/ec2/resources/instance_type_offerings/availability-zone/<region>.json, written from AWS by moto's
  scripts/ec2_get_instance_type_offerings.py; in us-west-2 it has p5.48xlarge in zones a to d, p5e.48xlarge in c
  only). `offerings({type: [zones]})` replaces the zones of those types (a zone that stops offering a type, or a
  region moto's data is out of date for); the answer is then made here, in botocore's
  `DescribeInstanceTypeOfferingsResult` shape, from moto's data and the replacements.
- Service Quotas `GetServiceQuota`: moto knows only the `vpc` service and answers NoSuchResourceException for every
  `ec2` quota. The EC2 vCPU quotas are answered here, in botocore's `ServiceQuota` shape (the values of the AWS CLI
  reference's get-service-quota example: Unit "None", the AWS/Usage ResourceCount metric), from `quotas`, which
  `quota(code, value)` sets. AWS sets a new account's values per account (low: often 0 to a few dozen vCPUs for P
  and G); the default here is an account that asked for what docs/install.md says (384 vCPUs of P: a p5.48xlarge
  pair; 192 of G and VT), so a test of a new account sets its own.
- A node group's launches: moto makes every node group ACTIVE. EC2 refuses an instance type its zone does not offer
  and vCPUs past the family's quota; EKS reports it as the health issue AsgInstanceLaunchFailures with EC2's error
  in the message (the texts below are EC2's, as Auto Scaling's activity history shows them), and the node group
  ends CREATE_FAILED.
"""
import json
import re
import uuid
from xml.sax.saxutils import escape

from moto.core import DEFAULT_ACCOUNT_ID

from deployments.catalog import INSTANCE_TYPES

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
# Service Quotas' EC2 vCPU quotas: code → (name, the usage metric's Class, family letters, market).
EC2_VCPU_QUOTAS = {
    "L-417A185B": ("Running On-Demand P instances", "P/OnDemand", ("p",), "ON_DEMAND"),
    "L-7212CCBC": ("All P Spot Instance Requests", "P/Spot", ("p",), "SPOT"),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", "G/OnDemand", ("g", "vt"), "ON_DEMAND"),
    "L-3819A6DF": ("All G and VT Spot Instance Requests", "G/Spot", ("g", "vt"), "SPOT"),
}
DEFAULT_QUOTAS = {"L-417A185B": 384.0, "L-7212CCBC": 384.0, "L-DB2E81BA": 192.0, "L-3819A6DF": 192.0}


def _moto_offerings(region: str) -> list[dict]:
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS

    return INSTANCE_TYPE_OFFERINGS["availability-zone"].get(region, [])


def _filters(params: dict) -> dict[str, list[str]]:
    """EC2 query filters (Filter.N.Name, Filter.N.Value.M) as {name: values}."""
    found, n = {}, 1
    while f"Filter.{n}.Name" in params:
        values, m = [], 1
        while f"Filter.{n}.Value.{m}" in params:
            values.append(params[f"Filter.{n}.Value.{m}"][0])
            m += 1
        found[params[f"Filter.{n}.Name"][0]] = values
        n += 1
    return found


def _quota_code(instance_type: str, capacity_type: str) -> str | None:
    match = re.match(r"([a-z]+)\d", instance_type)
    return next((code for code, (_, _, letters, market) in EC2_VCPU_QUOTAS.items()
                 if match and match.group(1) in letters and market == capacity_type), None)


class AccountLimits:
    """The emulated account's offerings and quotas, per server; `reset` restores the defaults."""

    def __init__(self):
        self.replaced: dict[str, list[str]] = {}  # instance type → the zones that offer it, where a test says so
        self.quotas: dict[str, float] = dict(DEFAULT_QUOTAS)

    def reset(self) -> None:
        self.replaced.clear()
        self.quotas = dict(DEFAULT_QUOTAS)

    def zones(self, instance_type: str, region: str) -> list[str]:
        """The zones of `region` that offer the type, as this account sees them."""
        if instance_type in self.replaced:
            return sorted(z for z in self.replaced[instance_type] if z.startswith(region))
        return sorted(o["Location"] for o in _moto_offerings(region) if o["InstanceType"] == instance_type)

    # --- EC2 DescribeInstanceTypeOfferings ---------------------------------------------------------------------------
    def ec2_answer(self, action: str, params: dict, *, region: str):
        """The answer to DescribeInstanceTypeOfferings by zone once a test replaced some offerings; None: moto's."""
        if action != "DescribeInstanceTypeOfferings" or not self.replaced or \
                params.get("LocationType", [""])[0] != "availability-zone":
            return None
        filters = _filters(params)
        if set(filters) - {"instance-type", "location"}:
            raise AssertionError(f"the emulated offerings do not filter by {sorted(set(filters))}")
        types = filters.get("instance-type") or sorted({o["InstanceType"] for o in _moto_offerings(region)}
                                                         | set(self.replaced))
        items = "".join(f"<item><instanceType>{escape(t)}</instanceType><locationType>availability-zone"
                        f"</locationType><location>{escape(z)}</location></item>"
                        for t in types for z in self.zones(t, region)
                        if "location" not in filters or z in filters["location"])
        body = (f'<?xml version="1.0" encoding="UTF-8"?><DescribeInstanceTypeOfferingsResponse xmlns="{EC2_NS}">'
                f"<requestId>{uuid.uuid4()}</requestId><instanceTypeOfferingSet>{items}</instanceTypeOfferingSet>"
                "</DescribeInstanceTypeOfferingsResponse>")
        return 200, [("Content-Type", "text/xml")], body.encode()

    # --- Service Quotas GetServiceQuota ----------------------------------------------------------------------------
    def quota_answer(self, target: str, body: bytes, *, region: str):
        """The answer to GetServiceQuota of an EC2 vCPU quota; None for what moto answers (other services)."""
        if target.rsplit(".", 1)[-1] != "GetServiceQuota":
            return None
        request = json.loads(body or b"{}")
        code = request.get("QuotaCode", "")
        if request.get("ServiceCode") != "ec2":
            return None
        if code not in EC2_VCPU_QUOTAS or code not in self.quotas:
            return 400, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(
                {"__type": "NoSuchResourceException", "Message": f"The request failed because the specified "
                                                                  f"quota {code} does not exist."}).encode()
        name, metric_class, _, _ = EC2_VCPU_QUOTAS[code]
        quota = {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                 "QuotaArn": f"arn:aws:servicequotas:{region}:{DEFAULT_ACCOUNT_ID}:ec2/{code}", "QuotaCode": code,
                 "QuotaName": name, "Value": self.quotas[code], "Unit": "None", "Adjustable": True,
                 "GlobalQuota": False,
                 "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                                 "MetricDimensions": {"Class": metric_class, "Resource": "vCPU", "Service": "EC2",
                                                      "Type": "Resource"},
                                 "MetricStatisticRecommendation": "Maximum"}}
        return 200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps({"Quota": quota}).encode()

    # --- what a node group's launches meet -------------------------------------------------------------------------
    def launch_issue(self, cluster: str, request: dict, *, region: str) -> str | None:
        """Why EC2 refuses a new node group's instances, in its words: a type its subnets' zone does not offer, or
        vCPUs past the family's quota once every node group of the region runs; None when it launches them."""
        from moto.ec2.models import ec2_backends
        from moto.eks.models import eks_backends

        eks = eks_backends[DEFAULT_ACCOUNT_ID][region]
        ec2 = ec2_backends[DEFAULT_ACCOUNT_ID][region]
        zones = sorted({ec2.get_subnet(s).availability_zone for s in request.get("subnets") or []})
        market = "Spot" if request.get("capacityType") == "SPOT" else "On-Demand"
        for itype in request.get("instanceTypes") or []:
            offered = self.zones(itype, region)
            if zones and zones[0] not in offered:
                return (f"Could not launch {market} Instances. Unsupported - Your requested instance type ({itype}) "
                        f"is not supported in your requested Availability Zone ({zones[0]}). Please retry your "
                        f"request by not specifying an Availability Zone or choosing {', '.join(offered)}. "
                        "Launching EC2 instance failed.")
            code = _quota_code(itype, request.get("capacityType") or "ON_DEMAND")
            if code is not None and self._vcpus(eks, code) > self.quotas.get(code, 0):
                return (f"Could not launch {market} Instances. VcpuLimitExceeded - You have requested more vCPU "
                        f"capacity than your current vCPU limit of {self.quotas.get(code, 0):g} allows for the "
                        "instance bucket that the specified instance type belongs to. Please visit "
                        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit. "
                        "Launching EC2 instance failed.")
        return None

    @staticmethod
    def _vcpus(eks, code: str) -> int:
        """vCPUs the region's node groups launch against one quota (their desired size; failed ones run none)."""
        total = 0
        for cluster in eks.clusters.values():
            for g in cluster.nodegroups.values():
                itype = (g.instance_types or [""])[0]
                if g.status != "CREATE_FAILED" and itype in INSTANCE_TYPES and \
                        _quota_code(itype, g.capacity_type or "ON_DEMAND") == code:
                    total += g.scaling_config.get("desiredSize", 0) * INSTANCE_TYPES[itype].vcpus
        return total
