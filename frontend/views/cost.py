"""The team's cost page: spend per day by deployment for a month (a chart and a table), the budget, and the CSV
for chargeback; and the pause and resume buttons of a deployment."""
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.utils import timezone
from django.views.decorators.http import require_POST

from deployments.services import pause
from deployments.services.budgets import budget_state
from deployments.spend import month_bounds, team_spend
from frontend.views.base import render_page, require_team, team_required
from frontend.views.deployments import _act, _visible


@login_required
@team_required
def team_cost(request):
    """Spend per UTC day by deployment for `?month=YYYY-MM` (this month by default), with the month's total."""
    team = require_team(request)
    now = timezone.now()
    try:
        since, until = month_bounds(request.GET.get("month") or None, now=now)
    except ValueError:
        raise Http404("No such month.") from None
    spend = team_spend(team=team, since=since, until=min(until, now))
    days = spend.by_day()
    deployments = spend.by_deployment()
    chart = {"labels": [d["date"].isoformat() for d in days],
             "series": [{"name": dep["name"], "usd": [round(d["by_deployment"].get(dep["name"], 0.0), 4) for d in days]}
                        for dep in deployments]}
    previous = (since - timezone.timedelta(days=1)).strftime("%Y-%m")
    following = until.strftime("%Y-%m") if until <= now else None
    context = {"team": team, "month": since, "spend": spend, "days": days, "deployments": deployments,
               "chart": chart, "previous": previous, "following": following}
    if since <= now < until:  # this month: the banner's month so far is this page's total
        context["budget"] = budget_state(team=team, spent_usd=spend.total_usd)
    return render_page(request, "teams/cost.html", context)


@login_required
@require_POST
def deployment_pause(request, pk: int):
    """Tear the serving part down; the deployment, keys and history stay."""
    d = _visible(request, pk)
    return _act(request, d, lambda: pause.deployment_pause(actor=request.user, deployment=d),
                f"Pausing {d.name}: its GPUs are freed once the serving part is gone.")


@login_required
@require_POST
def deployment_resume(request, pk: int):
    """Bring a paused deployment back (the quota is checked again)."""
    d = _visible(request, pk)
    return _act(request, d, lambda: pause.deployment_resume(actor=request.user, deployment=d),
                f"Resuming {d.name}: your keys are let in once it runs and passes its checks.")
