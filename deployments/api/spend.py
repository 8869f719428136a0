"""A team's spend for the REST API: JSON for people and scripts, CSV (`?format=csv`) for chargeback."""
import csv
import io

from django.utils import timezone
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response

from deployments.services.budgets import budget_state
from deployments.spend import month_bounds, team_spend

CSV_COLUMNS = ["date", "team", "deployment", "deployment_id", "cluster", "stage", "instance_type", "node_hours", "usd"]


class CSVRenderer(BaseRenderer):
    """Rows (a list of dicts with CSV_COLUMNS) as CSV; an error body as one `error` column."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        if isinstance(data, list):
            writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(data)
        else:  # an error body (deployments.api.contract.ERROR_SCHEMA): its detail, then each field's messages
            rows = [["error", "field"], [data.get("detail", ""), ""]]
            rows += [[str(m), field] for field, msgs in (data.get("errors") or {}).items() for m in msgs]
            csv.writer(out).writerows(rows)
        return out.getvalue().encode()


SpendRendering = [JSONRenderer, BrowsableAPIRenderer, CSVRenderer]


def _money(x: float) -> float:
    return round(x, 4)


def team_spend_response(*, team, month: str | None, as_csv: bool) -> Response:
    now = timezone.now()
    try:
        since, until = month_bounds(month, now=now)
    except ValueError:
        raise ValidationError({"month": [f"A month as YYYY-MM, e.g. {now:%Y-%m}; got {month!r}."]}) from None
    spend = team_spend(team=team, since=since, until=min(until, now))
    if as_csv:
        response = Response([{**r, "team": team.slug, "date": r["date"].isoformat(),
                              "node_hours": round(r["node_hours"], 4), "usd": _money(r["usd"])} for r in spend.rows])
        response["Content-Disposition"] = f'attachment; filename="tandem-{team.slug}-{since:%Y-%m}.csv"'
        return response
    this_month = since <= now < until  # the budget is this month's, and then `spend` is the month so far
    state = budget_state(team=team, spent_usd=spend.total_usd) if this_month else None
    return Response({
        "team": team.slug, "month": f"{since:%Y-%m}", "currency": "USD", "total_usd": _money(spend.total_usd),
        "monthly_budget_usd": team.monthly_budget_usd,
        "budget_used": None if state is None or state.used is None else round(state.used, 4),
        "days": [{"date": d["date"].isoformat(), "usd": _money(d["usd"]),
                  "by_deployment": {k: _money(v) for k, v in d["by_deployment"].items()}} for d in spend.by_day()],
        "deployments": [{**d, "usd": _money(d["usd"]), "node_hours": round(d["node_hours"], 4)}
                        for d in spend.by_deployment()],
    })
