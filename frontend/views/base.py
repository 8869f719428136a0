"""What every portal page shares: the signed-in user's current team (kept in the session) and page rendering.

One rule for the current team: the team a page shows in the switcher is the session's team from then on. A page
about one team's object (a deployment, a key) shows that team, so viewing it selects it, and the next page without
a team in its URL (Cost, Team, API keys, a new request) is about the same team; every other page shows the
session's team. `render_page` applies the rule, and the base template names the team in each page's <title>."""
from functools import wraps

from django.http import Http404
from django.shortcuts import render

from deployments import selectors
from deployments.permissions import team_role
from deployments.services.budgets import budget_state

SESSION_TEAM = "tandem_team_id"


def current_team(request):
    """The team chosen in the switcher, else the user's first team; None for a user in no team."""
    teams = selectors.teams_visible_to(request.user)
    team_id = request.session.get(SESSION_TEAM)
    team = teams.filter(pk=team_id).first() if team_id else None
    if team is None:
        team = teams.first()
        if team is not None:
            team_select(request, team)
    return team


def team_select(request, team) -> None:
    """Make `team` the session's current team (what the switcher shows and pages without a team in the URL use)."""
    if request.session.get(SESSION_TEAM) != team.pk:  # an unchanged session is not written again
        request.session[SESSION_TEAM] = team.pk


def require_team(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    return team


def render_page(request, template: str, context: dict | None = None, *, status: int = 200):
    """Render a full page (or, for htmx, the named partial `template#partial`) with the shell's context. The
    page's team (`context["team"]`, else the session's) is what the switcher shows, so it becomes the session's."""
    context = dict(context or {})
    if "#" not in template:
        team = context.get("team") or current_team(request)
        if team is not None:
            team_select(request, team)
        context["team"] = team
        context["teams"] = selectors.teams_visible_to(request.user)
        context["role"] = team_role(user=request.user, team=team) if team else None
        context["approvals_waiting"] = selectors.deployments_awaiting_approval_by(request.user).count()
        context.update(_budget_banner(team, context.get("budget")))
    return render(request, template, context, status=status)


def _budget_banner(team, state) -> dict:
    """What the shell's budget banner shows: the team's month so far against its budget, read here once per page
    (or taken from a view that summed the month already), never by the template."""
    if team is None or team.monthly_budget_usd is None:
        return {"budget": None, "budget_words": ""}
    state = state or budget_state(team=team)
    return {"budget": state, "budget_words": state.words(team) if state.warn else ""}


def team_required(view):
    """Pages about "your team": a user in no team gets a page that says how to get into one."""
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if current_team(request) is None:
            return render(request, "teams/none.html", {"teams": []}, status=403)
        return view(request, *args, **kwargs)
    return wrapped
