"""Teams, members and roles: who may see, request and approve."""
from django.db import transaction

from deployments.errors import Conflict, NotAllowed
from deployments.models import Membership, Team
from deployments.services.events import event_record


def is_platform_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_staff)


def team_role(*, user, team) -> str | None:
    """'admin', 'member' or None; platform admins count as admins of every team."""
    if is_platform_admin(user):
        return Membership.Role.ADMIN
    m = Membership.objects.filter(team=team, user=user).only("role").first()
    return m.role if m else None


def team_require_admin(*, user, team) -> None:
    if team_role(user=user, team=team) != Membership.Role.ADMIN:
        raise NotAllowed(f"Only admins of team {team.slug} can do this.")


@transaction.atomic
def team_create(*, actor, slug: str, name: str, gpu_quota: int = 0, allow_self_approval: bool = False) -> Team:
    """Create a team (platform admins only)."""
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can create teams.")
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(f"A team named {slug!r} already exists.", field="slug")
    team = Team.objects.create(slug=slug, name=name, gpu_quota=gpu_quota, allow_self_approval=allow_self_approval)
    event_record(kind="team_created", team=team, actor=actor,
                 after={"slug": slug, "gpu_quota": gpu_quota, "allow_self_approval": allow_self_approval})
    return team


@transaction.atomic
def team_update(*, actor, team: Team, **changes) -> Team:
    """Change a team's name, quota or self-approval (platform admins only)."""
    if not is_platform_admin(actor):
        raise NotAllowed("Only platform admins can change a team's quota or settings.")
    # Compare with the stored row, not the caller's object: a form may have set the new values on it already.
    team = Team.objects.select_for_update().get(pk=team.pk)
    before = {k: getattr(team, k) for k in changes}
    if before == changes:
        return team
    for k, v in changes.items():
        setattr(team, k, v)
    team.save(update_fields=list(changes))
    event_record(kind="team_updated", team=team, actor=actor, before=before, after=changes)
    return team


@transaction.atomic
def membership_set(*, actor, team: Team, user, role: str, message: str = "") -> Membership:
    """Add a user to a team or change their role (platform admins and team admins). `actor=None` is Tandem
    itself acting on what the identity provider says (deployments/services/sign_in.py)."""
    if actor is not None:
        team_require_admin(user=actor, team=team)
    m, created = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    if not created and m.role == role:
        return m
    before = None if created else {"user": user.username, "role": m.role}
    m.role = role
    m.save(update_fields=["role"])
    event_record(kind="member_added" if created else "member_role_changed", team=team, actor=actor,
                 message=message, before=before, after={"user": user.username, "role": role})
    return m


@transaction.atomic
def membership_remove(*, actor, membership: Membership, message: str = "") -> None:
    """Take a user out of a team (platform admins and team admins; `actor=None` is Tandem, as above)."""
    if actor is not None:
        team_require_admin(user=actor, team=membership.team)
    event_record(kind="member_removed", team=membership.team, actor=actor, message=message,
                 before={"user": membership.user.username, "role": membership.role})
    membership.delete()
