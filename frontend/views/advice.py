"""The deployment page's latency-targets panel (attainment, diagnoses by stage, recommendations) and the one-click
action that turns a recommendation into an update."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from deployments import selectors
from deployments.errors import ActionError
from deployments.permissions import deployment_may_change
from deployments.services.teams import team_update
from frontend.views.base import render_page, require_team, team_required
from observability.rollups import WINDOWS
from observability.services.advice import deployment_advice, recommendation_apply


def _window(request) -> str:
    window = request.GET.get("targets_window") or request.POST.get("targets_window") or "1h"
    return window if window in WINDOWS else "1h"


def targets_context(request, d) -> dict:
    """What the panel shows for the window asked for (?targets_window=, default 1h)."""
    window = _window(request)
    advice = deployment_advice(deployment=d, window=window, now=timezone.now()) if d.spec_typed.targets else None
    return {"advice": advice.to_json() if advice else None, "targets_window": window, "windows": list(WINDOWS),
            "can_apply": deployment_may_change(user=request.user, deployment=d)}


@login_required
def deployment_targets(request, pk: int):
    """The panel alone for htmx (another window); the whole page otherwise."""
    d = get_object_or_404(selectors.deployments_visible_to(request.user), pk=pk)
    if not request.htmx:
        return redirect(f"/deployments/{d.pk}/?targets_window={_window(request)}#targets-panel")
    return render_page(request, "deployments/detail_targets.html", {"d": d} | targets_context(request, d))


@login_required
@require_POST
def deployment_recommendation_apply(request, pk: int, rec_id: str):
    """Turn the recommendation shown into an update: applied at once within the approved replica bounds, else
    proposed for approval."""
    d = get_object_or_404(selectors.deployments_visible_to(request.user), pk=pk)
    try:
        d = recommendation_apply(actor=request.user, deployment=d, rec_id=rec_id, window=_window(request),
                                 now=timezone.now())
    except ActionError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, "Update proposed: it waits for an admin's approval." if d.proposal_open
                         else "Update applied: the deployment is rolling it out.")
    return redirect("frontend:deployment-detail", pk=d.pk)


@login_required
@require_POST
@team_required
def team_auto_apply(request):
    """Team admins let Tandem apply recommendations within the approved replica bounds, or stop it."""
    team = require_team(request)
    on = request.POST.get("auto_apply_recommendations") == "on"
    try:
        team_update(actor=request.user, team=team, auto_apply_recommendations=on)
    except ActionError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, "Tandem applies recommendations within the approved bounds." if on
                         else "Recommendations wait for a person.")
    return redirect("frontend:team")
