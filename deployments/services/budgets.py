"""Monthly budgets: where a team stands, the 80% warning to its admins, and the rule for decisions past 100%.

Nothing running is ever stopped by a budget. Past 100%, a request or an update that raises the hourly cost
needs a platform admin's approval (deployments.services.actions asks `budget_require_approver`), and so does a
resume (deployments.services.pause): a wake on request is refused. The gateway learns which teams are past 100%
from a Redis flag each budget check sets or clears (deployments.budget_flag).
"""
import datetime as dt
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from controlplane.redis_client import redis_client
from deployments.budget_flag import OVER_BUDGET_KEY
from deployments.cost import cluster_prices, spec_hourly_usd
from deployments.errors import NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import Deployment, Membership, Team
from deployments.permissions import is_platform_admin
from deployments.services.events import event_record
from deployments.spec import spec_load
from deployments.spend import team_month_to_date_usd

WARN_AT = 0.8


@dataclass(frozen=True)
class BudgetState:
    """A team's month so far against its budget (None: no budget)."""

    budget_usd: int | None
    spent_usd: float

    @property
    def used(self) -> float | None:
        """The share of the budget spent (None: no budget; a budget of 0 is used up by any spend)."""
        if self.budget_usd is None:
            return None
        if self.budget_usd == 0:
            return 1.0 if self.spent_usd > 0 else 0.0
        return self.spent_usd / self.budget_usd

    @property
    def warn(self) -> bool:
        return self.used is not None and self.used >= WARN_AT

    @property
    def over(self) -> bool:
        return self.used is not None and self.used >= 1.0

    def words(self, team: Team) -> str:
        return (f"Team {team.slug} has spent ${self.spent_usd:,.2f} of its ${self.budget_usd:,} monthly budget "
                f"this month ({self.used:.0%}).")


def budget_state(*, team: Team, now: dt.datetime | None = None, spent_usd: float | None = None) -> BudgetState:
    """Where the team stands this month; `spent_usd` is the month so far when the caller has summed it already
    (a cost page or the spend API showing this month), so it is not read again."""
    if team.monthly_budget_usd is None:
        return BudgetState(budget_usd=None, spent_usd=0.0)
    if spent_usd is None:
        spent_usd = team_month_to_date_usd(team=team, now=now or timezone.now())
    return BudgetState(budget_usd=team.monthly_budget_usd, spent_usd=spent_usd)


def budget_require_approver(*, actor, deployment: Deployment, new_spec: dict, old_spec: dict | None,
                            action: str = "approve it") -> None:
    """Past 100% of the budget, only a platform admin approves what raises the hourly cost (`old_spec` None: a
    new request, or a resume, from nothing; `actor=None`, Tandem, is no platform admin)."""
    if is_platform_admin(actor):
        return
    prices = cluster_prices(deployment.cluster)

    def hourly(spec: dict | None) -> float:  # a type nobody prices counts as nothing, as its timeline is charged
        return (spec_hourly_usd(spec_load(spec), prices=prices) or 0.0) if spec else 0.0

    raise_usd = hourly(new_spec) - hourly(old_spec)
    if raise_usd <= 0:
        return
    state = budget_state(team=deployment.team)
    if state.over:
        raise NotAllowed(f"{state.words(deployment.team)} This raises the hourly cost by ${raise_usd:,.2f}; past the "
                         f"budget, a platform admin has to {action}. Nothing running is stopped.")


def budgets_check(*, now: dt.datetime) -> list[str]:
    """Each beat: set or clear each team's over-budget flag, and warn its admins once a month when its spend
    reaches 80% of its budget; returns the teams warned."""
    month = now.astimezone(dt.UTC).strftime("%Y-%m")
    warned = []
    for team in Team.objects.filter(monthly_budget_usd__isnull=False):
        state = budget_state(team=team, now=now)
        budget_flag_set(team=team, state=state)
        if state.warn and team.budget_warned_month != month and _warn(team=team, month=month, state=state):
            warned.append(team.slug)
    return warned


def budget_flag_set(*, team: Team, state: BudgetState) -> None:
    """Tell every gateway replica whether the team is over its budget (`state.over`, the one rule): while the flag
    is set, a request to a paused deployment of the team is answered that it will not wake it."""
    if state.over:
        redis_client().set(OVER_BUDGET_KEY.format(team.pk), 1)
    else:
        redis_client().delete(OVER_BUDGET_KEY.format(team.pk))


@transaction.atomic
def _warn(*, team: Team, month: str, state: BudgetState) -> bool:
    team = Team.objects.select_for_update(no_key=True).get(pk=team.pk)
    if team.budget_warned_month == month:  # another pass warned first
        return False
    team.budget_warned_month = month
    team.save(update_fields=["budget_warned_month"])
    admins = sorted(Membership.objects.filter(team=team, role=Membership.Role.ADMIN)
                    .values_list("user__username", flat=True))
    event_record(kind=EventKind.BUDGET_WARNING, team=team,
                 message=f"{state.words(team)} At 100%, new requests and updates that raise the hourly cost need "
                         "a platform admin's approval; nothing running is stopped.",
                 after={"month": month, "spent_usd": round(state.spent_usd, 2), "budget_usd": state.budget_usd,
                        "admins": admins})
    return True
