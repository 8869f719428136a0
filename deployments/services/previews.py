"""What a request or an update of a deployment would do, without doing it: the server-side dry run behind
`POST /api/v1/deployments/preview/`, `POST /api/v1/deployments/<id>/preview/` and `tandemctl diff`.

A preview runs the real service (deployments.services.actions: spec parsing, model sources, quota, what needs
approval) inside a transaction it then rolls back, so there is one place for each rule and a preview refuses
exactly what the write would refuse, with the same error. What it reports is what the write says it did
(deployments.outcomes), costed at the cluster's prices, before the rollback. Nothing is kept: no row, no
generation, no event, and no reconcile request (a `transaction.on_commit` registered inside a rolled-back block is
discarded).
"""
from dataclasses import asdict, dataclass

from django.db import transaction

from deployments.cost import Prices, cluster_prices, spec_hourly_usd
from deployments.models import Cluster, Deployment, Team
from deployments.outcomes import Outcome
from deployments.quota_rules import quota_gpus
from deployments.services.actions import deployment_request, deployment_update
from deployments.spec import DeploymentSpec
from deployments.spec_diff import FieldChange, spec_created


@dataclass(frozen=True)
class Preview:
    """What the write would do: its outcome, each changed field old → new (and whether it needs an approver), the
    deployment's status and generation after it, cost per hour and GPUs against quota before and after."""

    outcome: str
    waits_for_approval: bool
    status: str
    generation: int
    changes: list[dict]
    hourly_usd_before: float | None
    hourly_usd_after: float | None
    gpus_before: int
    gpus_after: int


def _hourly(spec: DeploymentSpec, prices: Prices) -> float | None:
    cost = spec_hourly_usd(spec, prices=prices)
    return None if cost is None else round(cost, 3)


def deployment_request_preview(*, actor, team: Team, cluster: Cluster, name: str, spec: dict,
                               purpose: str = "") -> Preview:
    """What deployment_request would do with these arguments; nothing is kept."""
    with transaction.atomic():
        d = deployment_request(actor=actor, team=team, cluster=cluster, name=name, spec=spec, purpose=purpose)
        typed = d.spec_typed
        changes = spec_created(typed) + ([FieldChange("purpose", None, d.purpose, True)] if d.purpose else [])
        preview = Preview(outcome=Outcome.CREATED, waits_for_approval=True, status=d.status, generation=d.generation,
                          changes=[asdict(c) for c in changes], hourly_usd_before=0.0,
                          hourly_usd_after=_hourly(typed, cluster_prices(cluster)),
                          gpus_before=0, gpus_after=quota_gpus(typed, target_kind=cluster.kind))
        transaction.set_rollback(True)
    return preview


def deployment_update_preview(*, actor, deployment: Deployment, spec: dict | None = None,
                              purpose: str | None = None) -> Preview:
    """What deployment_update would do with these arguments (an edit, an update applied at once, a proposed
    update, or nothing); nothing is kept."""
    with transaction.atomic():
        done = deployment_update(actor=actor, deployment=deployment, spec=spec, purpose=purpose)
        d = done.deployment
        prices, kind = cluster_prices(d.cluster), d.cluster.kind
        preview = Preview(outcome=done.outcome, waits_for_approval=done.waits_for_approval, status=d.status,
                          generation=d.generation, changes=[asdict(c) for c in done.changes],
                          hourly_usd_before=_hourly(done.before, prices), hourly_usd_after=_hourly(done.after, prices),
                          gpus_before=quota_gpus(done.before, target_kind=kind),
                          gpus_after=quota_gpus(done.after, target_kind=kind))
        transaction.set_rollback(True)
    return preview
