"""Cost and budget pieces other pages include with one line: the budget banner and a deployment's cost card."""
import datetime as dt

from django import template

from deployments.services.budgets import budget_state
from usage.selectors import deployment_cost

register = template.Library()


@register.inclusion_tag("partials/budget_banner.html")
def budget_banner(team):
    """A banner once the team's month so far reaches 80% of its budget (nothing without a budget)."""
    state = budget_state(team=team) if team is not None and team.monthly_budget_usd is not None else None
    return {"team": team, "state": state, "words": state.words(team) if state and state.warn else ""}


@register.inclusion_tag("partials/deployment_cost.html")
def deployment_cost_card(d):
    """Cost per hour now, over the last day, per million output tokens; and the pause settings."""
    return {"d": d, "cost": deployment_cost(deployment=d, window=dt.timedelta(days=1)), "pause": d.spec_typed.pause}
