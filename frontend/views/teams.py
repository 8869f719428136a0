"""The team page (members, roles, GPU quota and usage) and the team switcher."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from deployments import selectors
from deployments.errors import ActionError, NotAllowed
from deployments.lifecycle import HOLDS_QUOTA
from deployments.services.teams import team_update
from frontend import planning
from frontend.views.base import render_page, require_team, team_required, team_select

LIFETIMES = ("credential_default_days", "credential_max_days")  # what the lifetimes form sets


@login_required
@require_http_methods(["GET", "POST"])
@team_required
def team_detail(request):
    """The current team: who is in it with which role, the GPU quota, what holds it, and how long its keys and
    its members' tokens may live (team admins change that here)."""
    team = require_team(request)
    errors, status = {}, 200
    if request.method == "POST":
        changes = {f: request.POST.get(f, "").strip() for f in LIFETIMES}
        errors, status = {f: ["A whole number of days."] for f, v in changes.items() if not v.isdigit()}, 400
        if not errors:
            try:
                team_update(actor=request.user, team=team, **{f: int(v) for f, v in changes.items()})
            except NotAllowed as e:
                errors, status = {"credential_max_days": [e.message]}, 403
            except ActionError as e:
                errors = {e.field or "credential_max_days": [e.message]}
            else:
                messages.success(request, "Saved the lifetimes of keys and tokens.")
                return redirect("frontend:team")
        team.refresh_from_db()
    holding = [{"d": d, "gpus": d.quota_gpus} for d in
               selectors.deployments_visible_to(request.user).filter(team=team, status__in=HOLDS_QUOTA)]
    return render_page(request, "teams/detail.html", {
        "team": team, "holding": holding, "errors": errors,
        "members": selectors.memberships_visible_to(request.user).filter(team=team).order_by("role", "user__username"),
        "quota": planning.quota_view(team=team, gpus=0),
        "events": selectors.events_visible_to(request.user).filter(team=team).order_by("-created_at")[:20],
    }, status=status)


@login_required
@require_POST
def team_switch(request):
    """Make another of your teams the current one (kept in the session), then go back where you were."""
    team = get_object_or_404(selectors.teams_visible_to(request.user), slug=request.POST.get("team", ""))
    team_select(request, team)
    nxt = request.POST.get("next", "")
    if not nxt or not url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        nxt = "/deployments/"
    return redirect(nxt)
