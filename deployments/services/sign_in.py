"""Company sign-in: the identity provider's group claim decides team memberships and platform admins.

At every OpenID Connect sign-in the user's groups are mapped through `TANDEM_OIDC_GROUP_MAP` (group → (team slug,
role)) and `TANDEM_OIDC_PLATFORM_ADMIN_GROUPS`. The mapping owns the teams it names: in those teams the user's
membership follows the claim (added, role changed, removed), each change audited with Tandem as the actor.
Memberships in teams the mapping does not name are granted by hand in Tandem and left alone.

The offboarding rule, applied when the claim takes a user out of a team: the team's API keys that user created
are revoked (and every gateway told at once), and when the user is then in no team and is no platform admin,
their personal access tokens are revoked too. Tokens of a user who stays in some team keep working; what they
reach shrinks with the memberships, which every API call checks.
"""
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from deployments.models import AccessToken, ApiKey, Membership, Team
from deployments.services.access_tokens import access_token_revoke
from deployments.services.api_keys import api_key_revoke
from deployments.services.events import event_record
from deployments.services.teams import membership_remove, membership_set

SOURCE = "the identity provider's groups claim at sign-in"
ROLE_RANK = {Membership.Role.MEMBER: 1, Membership.Role.ADMIN: 2}


@dataclass(frozen=True)
class GroupMapping:
    """What the settings say: which group makes whom a member or admin of which team, or a platform admin."""

    teams: dict[str, tuple[str, str]]  # group → (team slug, role)
    platform_admin_groups: frozenset[str]

    @classmethod
    def from_settings(cls) -> "GroupMapping":
        teams = {}
        for group, (slug, role) in settings.TANDEM_OIDC_GROUP_MAP.items():
            if role not in ROLE_RANK:
                raise ValueError(f"TANDEM_OIDC_GROUP_MAP[{group!r}]: role must be 'member' or 'admin', not {role!r}")
            teams[group] = (slug, role)
        return cls(teams=teams, platform_admin_groups=frozenset(settings.TANDEM_OIDC_PLATFORM_ADMIN_GROUPS))

    def managed_team_slugs(self) -> set[str]:
        return {slug for slug, _ in self.teams.values()}

    def roles_for(self, groups) -> dict[str, str]:
        """team slug → role the groups give (the higher role when two groups name one team)."""
        roles: dict[str, str] = {}
        for group in groups:
            if group in self.teams:
                slug, role = self.teams[group]
                if ROLE_RANK[role] > ROLE_RANK.get(roles.get(slug), 0):
                    roles[slug] = role
        return roles


def claim_groups(claims: dict) -> list[str]:
    """The groups named by the configured claim; a missing claim is no groups, a single string one group."""
    value = claims.get(settings.TANDEM_OIDC_GROUPS_CLAIM) or []
    if isinstance(value, str):
        return [value]
    return [g for g in value if isinstance(g, str)]


@transaction.atomic
def sign_in_user_from_claims(*, claims: dict, user=None):
    """Create or update the user the claims describe and make their memberships follow the groups claim."""
    User = get_user_model()
    if user is None:
        username = claims[settings.TANDEM_OIDC_USERNAME_CLAIM]
        user, created = User.objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
            event_record(kind="user_created", actor=None, message="First sign-in through the identity provider.",
                         after={"user": username})
    fields = (("email", "email"), ("first_name", "given_name"), ("last_name", "family_name"))
    changed = {k: claims[c] for k, c in fields if claims.get(c) and getattr(user, k) != claims[c]}
    if changed:
        User.objects.filter(pk=user.pk).update(**changed)
        for k, v in changed.items():
            setattr(user, k, v)
    return sign_in_sync_memberships(user=user, groups=claim_groups(claims))


@transaction.atomic
def sign_in_sync_memberships(*, user, groups: list[str], mapping: GroupMapping | None = None):
    """Make the user's memberships in the mapped teams, and their platform-admin flag, equal what `groups` give;
    returns the user as stored now."""
    mapping = mapping or GroupMapping.from_settings()
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    _sync_platform_admin(user=user, is_admin=bool(mapping.platform_admin_groups & set(groups)))
    wanted = mapping.roles_for(groups)
    teams = {t.slug: t for t in Team.objects.filter(slug__in=mapping.managed_team_slugs())}
    current = {m.team.slug: m for m in Membership.objects.select_related("team")
               .filter(user=user, team__slug__in=mapping.managed_team_slugs())}
    for slug, role in wanted.items():
        team = teams.get(slug)
        if team is None:
            event_record(kind="sign_in_mapping_unknown_team", actor=None,
                         message=f"A group maps {user.username} to team {slug!r}, which does not exist; create it.",
                         after={"user": user.username, "team": slug})
            continue
        membership_set(actor=None, team=team, user=user, role=role, message=f"From {SOURCE}.")
    for slug, membership in current.items():
        if slug not in wanted:
            membership_remove(actor=None, membership=membership, message=f"From {SOURCE}.")
            _offboard_from_team(user=user, team=membership.team)
    if not user.is_staff and not Membership.objects.filter(user=user).exists():
        for token in AccessToken.objects.filter(user=user, revoked_at__isnull=True):
            access_token_revoke(user=None, token=token)
    return user


def _sync_platform_admin(*, user, is_admin: bool) -> None:
    if user.is_staff == is_admin and user.is_superuser == is_admin:
        return
    before = {"user": user.username, "platform_admin": user.is_staff}
    user.is_staff = user.is_superuser = is_admin
    user.save(update_fields=["is_staff", "is_superuser"])
    event_record(kind="platform_admin_granted" if is_admin else "platform_admin_revoked", actor=None,
                 message=f"From {SOURCE}.", before=before, after={"user": user.username, "platform_admin": is_admin})


def _offboard_from_team(*, user, team: Team) -> None:
    """The team's keys this user created stop working at every gateway."""
    for key in ApiKey.objects.filter(team=team, created_by=user, revoked_at__isnull=True, is_service=False):
        api_key_revoke(actor=None, key=key, message=f"{user.username} left team {team.slug} ({SOURCE}).")
