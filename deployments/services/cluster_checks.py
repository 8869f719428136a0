"""The preflight's writes: a platform admin (or a registration) asks for a run, a worker records what it found.

The checks themselves read the cluster and AWS (workers.preflight), so they run in a worker, with the worker's
credentials: what they see is what a deployment will meet.
"""
from celery import current_app
from django.db import transaction
from django.utils import timezone

from deployments import selectors
from deployments.check_subjects import spec_subjects
from deployments.errors import Conflict, NotAllowed
from deployments.models import Cluster, ClusterCheck, ClusterCheckLine
from deployments.permissions import is_platform_admin
from deployments.redaction import internal_redact
from deployments.spec import DeploymentSpec

# By name, not by import: the domain imports nothing from the workers.
CHECK_TASK = "workers.tasks.check_cluster"


def cluster_check_request(*, actor, cluster: Cluster) -> ClusterCheck:
    """Start a preflight run of `cluster` (platform admins); the worker runs it once this transaction commits."""
    if actor is not None and not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can check clusters.")
    run = ClusterCheck.objects.create(cluster=cluster, requested_by=actor)
    if cluster.kind == Cluster.Kind.RAY:  # not Kubernetes: nothing of the preflight applies
        return cluster_check_record(check_id=run.pk, lines=[])
    transaction.on_commit(lambda: current_app.send_task(CHECK_TASK, args=(run.pk,)))
    return run


@transaction.atomic
def cluster_check_record(*, check_id: int, lines: list[dict], error: str = "") -> ClusterCheck:
    """Store a run's lines (name, status, evidence, fix, subject) and its outcome; a finished run is not written again.
    Evidence names subnets, roles and groups as they are: platform admins read it (approvers read it redacted)."""
    run = ClusterCheck.objects.select_for_update().select_related("cluster").get(pk=check_id)
    if run.status != ClusterCheck.Status.RUNNING:
        return run
    ClusterCheckLine.objects.bulk_create(
        ClusterCheckLine(check_run=run, position=i, name=line["name"], status=line["status"],
                         evidence=line["evidence"][:4000],
                         fix=line.get("fix", "")[:2000], subject=line.get("subject", "")[:120])
        for i, line in enumerate(lines))
    if error:
        run.status, run.error = ClusterCheck.Status.ERROR, error[:2000]
    elif any(line["status"] == ClusterCheckLine.Status.FAIL for line in lines):
        run.status = ClusterCheck.Status.FAILED
    else:
        run.status = ClusterCheck.Status.PASSED
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "finished_at"])
    return run


def cluster_check_require_clear(*, actor, cluster: Cluster, spec: DeploymentSpec) -> None:
    """Refuse (409) to approve a deployment of `spec` onto `cluster` while the cluster's latest finished preflight
    fails a line about something the deployment uses (deployments.check_subjects: its instance types, their vCPU
    quota, its runtime), naming each such check with its evidence and fix: approved, it would buy GPUs that cannot
    serve. Approvers who are not platform admins read the evidence redacted, as on the approvals page."""
    uses = spec_subjects(spec)
    blocking = [line for line in selectors.cluster_check_failures({cluster.pk}).get(cluster.pk, [])
                if line.subject in uses]
    if not blocking:
        return
    show = (lambda text: text) if is_platform_admin(actor) else (lambda text: internal_redact(text, cluster=cluster))
    said = " ".join(f"{line.name} ({line.subject.partition(':')[2]}): {show(line.evidence)}"
                    + (f" Fix: {show(line.fix)}" if line.fix else "") for line in blocking)
    raise Conflict(f"Cluster {cluster.name}'s last check fails for what this deployment uses, so it would not "
                   f"start there. {said} Once fixed, run the cluster's checks again (tandemctl doctor "
                   f"{cluster.name}), then approve.")
