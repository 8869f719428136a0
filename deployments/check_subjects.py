"""What a preflight line is about (its `subject`), and the subjects a deployment uses: an approval is refused while
the cluster's latest finished check fails a line whose subject the deployment uses (services.cluster_checks).

A subject is `<kind>:<name>`: `instance:p5.48xlarge` (an instance type), `family:P` (an EC2 vCPU quota bucket,
deployments.ec2_quotas), `runtime:<runtime key>` (a runtime of the catalog and its images). A line without one is
about the cluster as a whole and stops no approval by itself (approvers see every failed line)."""
from deployments.ec2_quotas import quota_family
from deployments.spec import STAGES, DeploymentSpec


def instance_subject(instance_type: str) -> str:
    return f"instance:{instance_type}"


def family_subject(family: str) -> str:
    return f"family:{family}"


def runtime_subject(runtime_key: str) -> str:
    return f"runtime:{runtime_key}"


def spec_subjects(spec: DeploymentSpec) -> set[str]:
    """Every subject a deployment of this spec uses: its pools' instance types and their quota families, and its
    runtime."""
    subjects = {runtime_subject(spec.runtime)}
    for stage in STAGES:
        itype = spec.pool(stage).instance_type
        subjects.add(instance_subject(itype))
        if family := quota_family(itype):
            subjects.add(family_subject(family))
    return subjects
