"""Cost pieces other pages include with one line: a deployment's cost card."""
import datetime as dt

from django import template

from gateway.selectors import deployment_cost

register = template.Library()


@register.inclusion_tag("partials/deployment_cost.html")
def deployment_cost_card(d):
    """Cost per hour now, over the last day, per million output tokens; and the pause settings."""
    return {"d": d, "cost": deployment_cost(deployment=d, window=dt.timedelta(days=1)), "pause": d.spec_typed.pause}
