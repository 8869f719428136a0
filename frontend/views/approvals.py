"""The approvals queue: requests and proposed updates this user may decide, with what changed, plan, cost and
quota impact; each decision is bound to the generation (and proposed spec) shown here."""
from django.contrib.auth.decorators import login_required

from deployments import selectors
from deployments.model_sources import source_roots_of
from deployments.quota_rules import quota_gpus
from deployments.spec import spec_load
from deployments.spec_diff import spec_changes, spec_hourly_cost
from frontend import planning
from frontend.views.base import render_page


@login_required
def approval_queue(request):
    """What waits for this user's decision (team admins: their teams; platform admins: everything)."""
    items = []
    for d in selectors.deployments_awaiting_approval_by(request.user).order_by("created_at"):
        is_update = d.proposed_spec is not None
        spec = spec_load(d.proposed_spec) if is_update else d.spec_typed
        kind = d.cluster.kind
        plan, note = planning.plan_for_stored(spec, source_roots=source_roots_of(cluster=d.cluster, team=d.team))
        note = f"{note} GPUs, quota and cost are below." if plan is None else note
        gpus = quota_gpus(spec, target_kind=kind)
        items.append({
            "d": d, "spec": spec, "is_update": is_update, "current_gpus": d.quota_gpus,
            "changes": spec_changes(d.spec_typed, spec) if is_update else [],
            "cost_before": spec_hourly_cost(d.spec_typed) if is_update else None,
            "plan": plan, "plan_note": note, "cost": spec_hourly_cost(spec),
            "author": d.proposed_by or d.requested_by,
            "quota": planning.quota_view(team=d.team, gpus=gpus, exclude_id=d.pk,
                                         basis=planning.stored_quota_basis(spec, target_kind=kind)),
        })
    return render_page(request, "approvals/queue.html", {"items": items})
