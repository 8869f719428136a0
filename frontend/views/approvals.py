"""The approvals queue: requests and GPU-adding updates this user may decide, with plan and quota impact."""
from django.contrib.auth.decorators import login_required

from deployments import selectors
from deployments.model_sources import source_roots_of
from deployments.spec import spec_load
from frontend import planning
from frontend.views.base import render_page


@login_required
def approval_queue(request):
    """What waits for this user's decision (team admins: their teams; platform admins: everything)."""
    items = []
    for d in selectors.deployments_awaiting_approval_by(request.user).order_by("created_at"):
        spec = spec_load(d.proposed_spec or d.spec)
        plan, note = planning.plan_for_stored(spec, source_roots=source_roots_of(cluster=d.cluster, team=d.team))
        note = f"{note} GPUs, quota and cost are below." if plan is None else note
        items.append({
            "d": d, "spec": spec, "is_update": d.proposed_spec is not None, "current_gpus": d.spec_typed.gpus,
            "plan": plan, "plan_note": note, "cost": planning.spec_hourly_cost(spec),
            "quota": planning.quota_view(team=d.team, gpus=spec.gpus, exclude_id=d.pk),
        })
    return render_page(request, "approvals/queue.html", {"items": items})
