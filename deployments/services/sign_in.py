"""Company sign-in: who the identity is (`identities`), and its group claim decides team memberships and platform
admins.

At every OpenID Connect sign-in the user's groups are mapped through `TANDEM_OIDC_GROUP_MAP` (group → (team slug,
role)) and `TANDEM_OIDC_PLATFORM_ADMIN_GROUPS`. The mapping owns the teams it names: in those teams the user's
membership follows the claim (added, role changed, removed), each change audited with Tandem as the actor.
Memberships in teams the mapping does not name are granted by hand in Tandem and left alone.

A user the claim takes out of a team is offboarded as any removed member is (`teams.membership_remove`): the
team's API keys they created and their personal access tokens are revoked, every gateway told at once.
"""
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from deployments.event_kinds import EventKind
from deployments.models import Membership, Team
from deployments.services.events import event_record
from deployments.services.identities import SignInRefused, identity_user_for_sign_in
from deployments.services.teams import membership_remove, membership_set, platform_admin_set

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


def sign_in_user_from_claims(*, claims: dict, issuer: str):
    """The one decision of a company sign-in: which account the identity (issuer, `sub`) is
    (`identities.identity_user_for_sign_in`), its name and e-mail as the claims say now, and its memberships
    following the groups claim. A refusal changes nothing, is recorded as an audit event and is raised
    (SignInRefused, whose message the person sees)."""
    try:
        with transaction.atomic():
            user = identity_user_for_sign_in(issuer=issuer, claims=claims)
            fields = (("email", "email"), ("first_name", "given_name"), ("last_name", "family_name"))
            changed = {k: claims[c] for k, c in fields if claims.get(c) and getattr(user, k) != claims[c]}
            if changed:
                get_user_model().objects.filter(pk=user.pk).update(**changed)
            return sign_in_sync_memberships(user=user, groups=claim_groups(claims))
    except SignInRefused as refused:
        event_record(kind=EventKind.SIGN_IN_REFUSED, actor=None, message=refused.message,
                     after={"reason": refused.reason, "account": refused.account, "issuer": issuer,
                            "subject": str(claims.get("sub")), "email": claims.get("email")})
        raise


@transaction.atomic
def sign_in_sync_memberships(*, user, groups: list[str], mapping: GroupMapping | None = None, source: str = SOURCE):
    """Make the user's memberships in the mapped teams, and their platform-admin flag, equal what `groups` give
    (`source` names where the groups came from in the events: the sign-in's claim, or the directory's pushes);
    returns the user as stored now. A deactivated user's groups give nothing back: the OIDC backend builds the user
    before the sign-in view refuses an inactive one, and a directory may still list a leaver in its groups."""
    mapping = mapping or GroupMapping.from_settings()
    user = get_user_model().objects.select_for_update().get(pk=user.pk)
    if not user.is_active:
        return user
    platform_admin_set(actor=None, user=user, is_admin=bool(mapping.platform_admin_groups & set(groups)),
                       message=f"From {source}.")
    wanted = mapping.roles_for(groups)
    teams = {t.slug: t for t in Team.objects.filter(slug__in=mapping.managed_team_slugs())}
    current = {m.team.slug: m for m in Membership.objects.select_related("team")
               .filter(user=user, team__slug__in=mapping.managed_team_slugs())}
    for slug, role in wanted.items():
        team = teams.get(slug)
        if team is None:
            event_record(kind=EventKind.SIGN_IN_MAPPING_UNKNOWN_TEAM, actor=None,
                         message=f"A group maps {user.username} to team {slug!r}, which does not exist; create it.",
                         after={"user": user.username, "team": slug})
            continue
        membership_set(actor=None, team=team, user=user, role=role, message=f"From {source}.")
    for slug, membership in current.items():
        if slug not in wanted:
            membership_remove(actor=None, membership=membership,
                              message=f"{user.username} left team {slug} ({source}).")
    return user
