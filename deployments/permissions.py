"""Who may do what: the permission reads every service, view and page asks, each rule in one place.

Reads only (a role, a yes or no); the services that write import them, and this module imports no service, so a
rule never needs an import inside a function to dodge a circle.
"""
from deployments.errors import NotAllowed
from deployments.models import Membership


def is_platform_admin(user) -> bool:
    return bool(user and user.is_authenticated and user.is_staff)


def team_role(*, user, team) -> str | None:
    """'admin', 'member' or None; platform admins count as admins of every team."""
    if is_platform_admin(user):
        return Membership.Role.ADMIN
    m = Membership.objects.filter(team=team, user=user).only("role").first()
    return m.role if m else None


def team_is_admin(*, user, team) -> bool:
    """An admin of `team`, or a platform admin."""
    return team_role(user=user, team=team) == Membership.Role.ADMIN


def team_require_admin(*, user, team) -> None:
    if not team_is_admin(user=user, team=team):
        raise NotAllowed(f"Only admins of team {team.slug} can do this.")


def deployment_may_change(*, user, deployment) -> bool:
    """Its requester or an admin of its team may edit, update, pause, resume, retry, withdraw or delete it (and
    apply a recommendation to it): the API refuses anyone else and the portal shows them no such button."""
    return user == deployment.requested_by or team_is_admin(user=user, team=deployment.team)


def deployment_may_decide(*, user, deployment) -> bool:
    """Team admins and platform admins approve or reject what waits on the deployment (whether they wrote it
    themselves is the approval service's own check: it reads who did)."""
    return team_is_admin(user=user, team=deployment.team)


def api_key_may_manage(*, user, key, team_admin: bool) -> bool:
    """A member manages (revokes, rotates) the keys they own; the team's admins (and platform admins) every key,
    team keys included. `team_admin`: whether `user` is an admin of the key's team, read once by the caller for a
    whole list of keys."""
    return team_admin or key.owner_id == user.pk
