"""The emulated account's limits (tests/support/account_limits.py, iam_simulator.py in front of moto) answer as AWS
does, in botocore's shapes, so the preflight and the eks driver meet what a real account says. Plain boto3, no
Tandem code."""
import json

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.support.moto_server import eks_cluster_create

REGION = "us-west-2"
ONE = {"minSize": 1, "maxSize": 1, "desiredSize": 1}


def _offered(aws, *types) -> dict[str, list[str]]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=aws.url)
    found: dict[str, list[str]] = {t: [] for t in types}
    for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": list(types)}]):
        for o in page["InstanceTypeOfferings"]:
            assert o["LocationType"] == "availability-zone"
            found[o["InstanceType"]].append(o["Location"])
    return {t: sorted(z) for t, z in found.items()}


def test_offerings_are_awss_as_moto_recorded_them_until_a_test_replaces_a_types_zones(aws):
    assert _offered(aws, "p5.48xlarge", "p5e.48xlarge") == {
        "p5.48xlarge": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"], "p5e.48xlarge": ["us-west-2c"]}
    aws.offerings({"p5.48xlarge": ["us-west-2b"]})
    assert _offered(aws, "p5.48xlarge", "g6e.xlarge") == {
        "p5.48xlarge": ["us-west-2b"], "g6e.xlarge": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]}
    aws.reset()
    assert _offered(aws, "p5.48xlarge")["p5.48xlarge"][0] == "us-west-2a"


def test_the_ec2_vcpu_quotas_answer_as_service_quotas_does(aws):
    quotas = boto3.client("service-quotas", region_name=REGION, endpoint_url=aws.url)
    quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-417A185B")["Quota"]
    assert (quota["QuotaName"], quota["Value"], quota["Unit"]) == ("Running On-Demand P instances", 384.0, "None")
    assert quota["QuotaArn"] == "arn:aws:servicequotas:us-west-2:123456789012:ec2/L-417A185B"
    assert quota["UsageMetric"]["MetricDimensions"] == {"Class": "P/OnDemand", "Resource": "vCPU", "Service": "EC2",
                                                        "Type": "Resource"}
    aws.quota("L-DB2E81BA", 8)
    assert quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-DB2E81BA")["Quota"]["Value"] == 8.0
    with pytest.raises(ClientError) as unknown:
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-00000000")
    assert unknown.value.response["Error"]["Code"] == "NoSuchResourceException"
    # moto's own answers stay for the services it knows
    assert quotas.get_service_quota(ServiceCode="vpc", QuotaCode="L-F678F1CE")["Quota"]["QuotaCode"] == "L-F678F1CE"


def _node_group(aws, made, name, itype, *, desired=1):
    eks = boto3.client("eks", region_name=REGION, endpoint_url=aws.url)
    eks.create_nodegroup(clusterName="c", nodegroupName=name, subnets=made["subnet_ids"][:1],
                         nodeRole="arn:aws:iam::123456789012:role/nodes", instanceTypes=[itype],
                         scalingConfig={"minSize": desired, "maxSize": desired, "desiredSize": desired})
    aws.advance(name, cluster="c")  # once EKS is done creating it: ACTIVE, or failed as EC2 refused its launch
    return eks.describe_nodegroup(clusterName="c", nodegroupName=name)["nodegroup"]


def test_launches_past_the_quota_or_outside_the_offering_fail_as_ec2_refuses_them(aws):
    made = eks_cluster_create(url=aws.url, name="c", region=REGION, zones=("a",))
    aws.quota("L-417A185B", 192)
    assert _node_group(aws, made, "one", "p5.48xlarge")["status"] == "ACTIVE"
    second = _node_group(aws, made, "two", "p5.48xlarge")
    assert second["status"] == "CREATE_FAILED"
    assert second["health"]["issues"][0]["code"] == "AsgInstanceLaunchFailures"
    assert "VcpuLimitExceeded - You have requested more vCPU capacity than your current vCPU limit of 192 allows" in \
        second["health"]["issues"][0]["message"]
    assert _node_group(aws, made, "g", "g6e.xlarge")["status"] == "ACTIVE"  # another family, another quota

    aws.offerings({"g6e.48xlarge": ["us-west-2b", "us-west-2c"]})
    elsewhere = _node_group(aws, made, "big", "g6e.48xlarge")
    assert elsewhere["status"] == "CREATE_FAILED"
    assert "Unsupported - Your requested instance type (g6e.48xlarge) is not supported in your requested " \
           "Availability Zone (us-west-2a). Please retry your request by not specifying an Availability Zone or " \
           "choosing us-west-2b, us-west-2c." in elsewhere["health"]["issues"][0]["message"]


def test_the_policy_simulator_judges_each_resource_of_each_action(aws):
    iam = boto3.client("iam", region_name=REGION, endpoint_url=aws.url)
    iam.create_role(RoleName="driver", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
    iam.put_role_policy(RoleName="driver", PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "eks:DeleteNodegroup", "Resource": "arn:aws:eks:*:*:nodegroup/c/tandem-*/*",
             "Condition": {"StringEquals": {"aws:ResourceTag/tandem.dev/managed-by": "tandem"}}},
            {"Effect": "Deny", "Action": "eks:*", "Resource": "arn:aws:eks:*:*:nodegroup/c/tandem-locked/*"}]}))
    ours, other, locked = (f"arn:aws:eks:us-west-2:123456789012:nodegroup/c/{n}/00000000-0000-0000-0000-000000000000"
                           for n in ("tandem-d1-prefill", "search", "tandem-locked"))
    tagged = [{"ContextKeyName": "aws:ResourceTag/tandem.dev/managed-by", "ContextKeyValues": ["tandem"],
               "ContextKeyType": "string"}]

    result, = iam.simulate_principal_policy(PolicySourceArn="arn:aws:iam::123456789012:role/driver",
                                            ActionNames=["eks:DeleteNodegroup"], ResourceArns=[ours, other, locked],
                                            ContextEntries=tagged)["EvaluationResults"]

    assert result["EvalDecision"] == "explicitDeny"  # the most restrictive of the three
    assert [(r["EvalResourceName"], r["EvalResourceDecision"]) for r in result["ResourceSpecificResults"]] == [
        (ours, "allowed"), (other, "implicitDeny"), (locked, "explicitDeny")]
    untagged, = iam.simulate_principal_policy(PolicySourceArn="arn:aws:iam::123456789012:role/driver",
                                              ActionNames=["eks:DeleteNodegroup"], ResourceArns=[ours]
                                              )["EvaluationResults"]
    assert untagged["EvalDecision"] == "implicitDeny"  # the condition needs the tag
    with pytest.raises(ClientError) as missing:
        iam.simulate_principal_policy(PolicySourceArn="arn:aws:iam::123456789012:role/nobody", ActionNames=["s3:*"])
    assert missing.value.response["Error"]["Code"] == "NoSuchEntity"
