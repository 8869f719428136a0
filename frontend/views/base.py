"""What every portal page shares: the signed-in user's current team (kept in the session) and page rendering."""
from functools import wraps

from django.http import Http404
from django.shortcuts import render

from deployments import selectors
from deployments.services.teams import team_role

SESSION_TEAM = "tandem_team_id"


def current_team(request):
    """The team chosen in the switcher, else the user's first team; None for a user in no team."""
    teams = selectors.teams_visible_to(request.user)
    team_id = request.session.get(SESSION_TEAM)
    team = teams.filter(pk=team_id).first() if team_id else None
    if team is None:
        team = teams.first()
        if team is not None:
            request.session[SESSION_TEAM] = team.pk
    return team


def require_team(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    return team


def render_page(request, template: str, context: dict | None = None, *, status: int = 200):
    """Render a full page (or, for htmx, the named partial `template#partial`) with the shell's context."""
    context = dict(context or {})
    if "#" not in template:
        team = context.get("team") or current_team(request)
        context.setdefault("team", team)
        context["teams"] = selectors.teams_visible_to(request.user)
        context["role"] = team_role(user=request.user, team=team) if team else None
        context["approvals_waiting"] = selectors.deployments_awaiting_approval_by(request.user).count()
    return render(request, template, context, status=status)


def team_required(view):
    """Pages about "your team": a user in no team gets a page that says how to get into one."""
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if current_team(request) is None:
            return render(request, "teams/none.html", {"teams": []}, status=403)
        return view(request, *args, **kwargs)
    return wrapped
