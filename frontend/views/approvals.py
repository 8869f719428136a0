"""The approvals queue: requests and proposed updates this user may decide, with what changed, plan, cost and
quota impact; each decision is bound to the generation (and proposed spec) shown here."""
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.utils import timezone

from deployments import selectors
from deployments.cost import cluster_prices, spec_hourly_usd
from deployments.lifecycle import HOLDS_QUOTA
from deployments.model_sources import source_roots_of
from deployments.permissions import is_platform_admin
from deployments.quota_rules import quota_gpus
from deployments.redaction import internal_redact
from deployments.services.quota import teams_gpus_held
from deployments.spec import spec_load
from deployments.spec_diff import spec_changes
from frontend import planning
from frontend.views.base import render_page
from observability.selectors import fleet_reader

QUEUE_PAGE_SIZE = 20


@login_required
def approval_queue(request):
    """What waits for this user's decision (team admins: their teams; platform admins: everything), oldest first,
    a page at a time."""
    queue = selectors.deployments_awaiting_approval_by(request.user).order_by("created_at", "id")
    page = Paginator(queue, QUEUE_PAGE_SIZE).get_page(request.GET.get("page"))
    held = teams_gpus_held(team_ids={d.team_id for d in page})  # one query for the page, not one per item
    fleet = fleet_reader(user=request.user, now=timezone.now())  # read once per model source for the page
    failures = selectors.cluster_check_failures({d.cluster_id for d in page})  # likewise, one query
    admin = is_platform_admin(request.user)
    items = [_item(d, held[d.team_id], fleet)
             | {"cluster_failures": _failures(d, failures.get(d.cluster_id, []), admin), "cluster_page": admin}
             for d in page]
    return render_page(request, "approvals/queue.html", {"items": items, "page": page})


def _failures(d, lines, admin: bool) -> list[dict]:
    """The failed checks of the cluster's latest preflight, as this approver may read them (members and team
    admins do not read the cluster's subnets and roles)."""
    show = (lambda text: text) if admin else (lambda text: internal_redact(text, cluster=d.cluster))
    return [{"name": line.name, "evidence": show(line.evidence), "fix": show(line.fix)} for line in lines]


def _item(d, team_held: int, fleet) -> dict:
    """One request or proposed update as an approver reviews it; `team_held` is what its team holds in all."""
    is_update = d.proposal_open
    spec = spec_load(d.proposed_spec) if is_update else d.spec_typed
    kind, prices = d.cluster.kind, cluster_prices(d.cluster)  # what the team is charged at, so the approver sees it
    plan, note = planning.plan_for_stored(spec, source_roots=source_roots_of(cluster=d.cluster, team=d.team),
                                          fleet=fleet, prices=prices)
    note = f"{note} GPUs, quota and cost are below." if plan is None else note
    gpus = quota_gpus(spec, target_kind=kind)
    held_by_others = team_held - (d.quota_gpus if d.status in HOLDS_QUOTA else 0)
    return {
        "d": d, "spec": spec, "is_update": is_update, "current_gpus": d.quota_gpus,
        "changes": spec_changes(d.spec_typed, spec) if is_update else [],
        "cost_before": spec_hourly_usd(d.spec_typed, prices=prices) if is_update else None,
        "plan": plan, "plan_note": note, "cost": spec_hourly_usd(spec, prices=prices),
        "author": d.proposed_by,
        "quota": planning.quota_view(team=d.team, gpus=gpus, held=held_by_others,
                                     basis=planning.stored_quota_basis(spec, target_kind=kind)),
    }
