"""The team page (members, roles, GPU quota and usage) and the team switcher."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from deployments import selectors
from deployments.lifecycle import HOLDS_QUOTA
from frontend import planning
from frontend.views.base import SESSION_TEAM, render_page, require_team, team_required


@login_required
@team_required
def team_detail(request):
    """The current team: who is in it with which role, the GPU quota, and what holds it."""
    team = require_team(request)
    holding = [{"d": d, "gpus": d.spec_typed.gpus} for d in
               selectors.deployments_visible_to(request.user).filter(team=team, status__in=HOLDS_QUOTA)]
    return render_page(request, "teams/detail.html", {
        "team": team, "holding": holding,
        "members": selectors.memberships_visible_to(request.user).filter(team=team).order_by("role", "user__username"),
        "quota": planning.quota_view(team=team, gpus=0),
        "events": selectors.events_visible_to(request.user).filter(team=team).order_by("-created_at")[:20],
    })


@login_required
@require_POST
def team_switch(request):
    """Make another of your teams the current one (kept in the session), then go back where you were."""
    team = get_object_or_404(selectors.teams_visible_to(request.user), slug=request.POST.get("team", ""))
    request.session[SESSION_TEAM] = team.pk
    nxt = request.POST.get("next", "")
    if not nxt or not url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        nxt = "/deployments/"
    return redirect(nxt)
