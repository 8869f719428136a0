"""Teams, members and roles: who may see, request and approve."""
from django.db import transaction

from deployments.errors import ActionError, Conflict, NotAllowed
from deployments.event_kinds import EventKind
from deployments.models import Membership, Team
from deployments.permissions import is_platform_admin, team_require_admin
from deployments.services.access_tokens import access_tokens_revoke_for_person
from deployments.services.api_keys import api_keys_revoke_for_person
from deployments.services.budgets import budget_flag_set, budget_state
from deployments.services.events import event_record

# What a team admin may change on their own team; everything else (quota, self-approval, name) is a platform
# admin's.
TEAM_ADMIN_SETTINGS = frozenset({"credential_default_days", "credential_max_days", "auto_apply_recommendations"})


def _lifetime_errors(default_days, max_days) -> None:
    if not 1 <= max_days <= 3650:
        raise ActionError("The longest lifetime is between 1 and 3650 days.", field="credential_max_days")
    if not 1 <= default_days <= max_days:
        raise ActionError(f"The default lifetime is between 1 day and the longest ({max_days} days).",
                          field="credential_default_days")


@transaction.atomic
def team_create(*, actor, slug: str, name: str, gpu_quota: int = 0, allow_self_approval: bool = False,
                credential_default_days: int = 90, credential_max_days: int = 365,
                monthly_budget_usd: int | None = None, auto_apply_recommendations: bool = False) -> Team:
    """Create a team (platform admins only)."""
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can create teams.")
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(f"A team named {slug!r} already exists.", field="slug")
    _lifetime_errors(credential_default_days, credential_max_days)
    settings_ = {"gpu_quota": gpu_quota, "allow_self_approval": allow_self_approval,
                 "credential_default_days": credential_default_days, "credential_max_days": credential_max_days,
                 "monthly_budget_usd": monthly_budget_usd, "auto_apply_recommendations": auto_apply_recommendations}
    team = Team.objects.create(slug=slug, name=name, **settings_)
    event_record(kind=EventKind.TEAM_CREATED, team=team, actor=actor, after={"slug": slug, **settings_})
    return team


@transaction.atomic
def team_update(*, actor, team: Team, **changes) -> Team:
    """Change a team's settings: platform admins any of them; the team's admins the lifetimes of its keys and
    of its members' tokens, and whether Tandem applies the advisor's recommendations itself."""
    if not is_platform_admin(actor):
        team_require_admin(user=actor, team=team)
    # Compare with the stored row, not the caller's object: a form may have set the new values on it already.
    team = Team.objects.select_for_update(no_key=True).get(pk=team.pk)
    changes = {k: v for k, v in changes.items() if getattr(team, k) != v}
    if not changes:
        return team
    if "slug" in changes:
        raise ActionError("A team's slug does not change: it names the team's namespaces and URLs.", field="slug")
    if not is_platform_admin(actor) and set(changes) - TEAM_ADMIN_SETTINGS:
        raise NotAllowed("Only platform admins can change a team's quota, budget, name or self-approval; team "
                         "admins set the lifetimes of keys and tokens.")
    before = {k: getattr(team, k) for k in changes}
    _lifetime_errors(changes.get("credential_default_days", team.credential_default_days),
                     changes.get("credential_max_days", team.credential_max_days))
    for k, v in changes.items():
        setattr(team, k, v)
    team.save(update_fields=list(changes))
    event_record(kind=EventKind.TEAM_UPDATED, team=team, actor=actor, before=before, after=changes)
    if "monthly_budget_usd" in changes:  # the gateway's over-budget flag follows at once, not at the next check
        transaction.on_commit(lambda: budget_flag_set(team=team, state=budget_state(team=team)))
    return team


def _require_within_team(*, actor, user) -> None:
    """A team admin's rights end at the team: a platform admin's seat (which reaches every team) is theirs to
    change only for other platform admins. `actor=None` is Tandem acting on what the identity provider says."""
    if actor is not None and not is_platform_admin(actor) and is_platform_admin(user):
        raise NotAllowed(f"{user.get_username()} is a platform admin; only platform admins can add them to a team, "
                         "change their role or remove them.")


@transaction.atomic
def membership_set(*, actor, team: Team, user, role: str, message: str = "") -> Membership:
    """Add a user to a team or change their role (platform admins and team admins). `actor=None` is Tandem
    itself acting on what the identity provider says (deployments/services/sign_in.py)."""
    if actor is not None:
        team_require_admin(user=actor, team=team)
    _require_within_team(actor=actor, user=user)
    m, created = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    if not created and m.role == role:
        return m
    before = None if created else {"user": user.username, "role": m.role}
    m.role = role
    m.save(update_fields=["role"])
    event_record(kind=EventKind.MEMBER_ADDED if created else EventKind.MEMBER_ROLE_CHANGED, team=team, actor=actor,
                 message=message, before=before, after={"user": user.username, "role": role})
    return m


@transaction.atomic
def membership_remove(*, actor, membership: Membership, message: str = "") -> None:
    """Take a user out of a team (platform admins and team admins; `actor=None` is Tandem, as above), and offboard
    them from it: the team's API keys they own are revoked (announced to every gateway replica; team keys stay),
    and their personal access tokens too when this was their last team (a platform admin's reach every team
    anyway). A token left alive reaches only the teams its owner is still in: the API reads memberships on every
    request."""
    team, user = membership.team, membership.user
    if actor is not None:
        team_require_admin(user=actor, team=team)
    _require_within_team(actor=actor, user=user)
    why = message or f"{user.get_username()} left team {team.slug}."
    revoked_keys = api_keys_revoke_for_person(actor=actor, user=user, message=why, team=team)
    revoked_tokens = []
    # Locked: two removals of the same person at once must not each see the other team and both keep the tokens.
    seats = list(Membership.objects.select_for_update().filter(user=user).values_list("pk", flat=True))
    if seats == [membership.pk] and not is_platform_admin(user):  # a platform admin's token reaches no less now
        revoked_tokens = access_tokens_revoke_for_person(actor=actor, user=user, message=why)
    event_record(kind=EventKind.MEMBER_REMOVED, team=team, actor=actor, message=message,
                 before={"user": user.get_username(), "role": membership.role},
                 after={"api_keys_revoked": revoked_keys, "access_tokens_revoked": revoked_tokens})
    membership.delete()


@transaction.atomic
def platform_admin_set(*, actor, user, is_admin: bool, message: str = "") -> None:
    """Make a user a platform admin or not (Django admin, or Tandem at an OIDC sign-in when `actor` is None)."""
    if actor is not None and not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can change who is a platform admin.")
    if user.is_staff == is_admin and user.is_superuser == is_admin:
        return
    before = {"user": user.get_username(), "platform_admin": user.is_staff}
    user.is_staff = user.is_superuser = is_admin
    user.save(update_fields=["is_staff", "is_superuser"])
    event_record(kind=EventKind.PLATFORM_ADMIN_GRANTED if is_admin else EventKind.PLATFORM_ADMIN_REVOKED, actor=actor,
                 message=message, before=before, after={"user": user.get_username(), "platform_admin": is_admin})
