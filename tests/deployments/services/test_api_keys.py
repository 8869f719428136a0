"""Keys have an owner: a person, whose keys go when they go, or the team (a team key, its service account), which
only the team's admins create, and to which only they move a person's key."""
import importlib
import threading

import pytest
from django.db import connection, transaction

from deployments.gateway_channels import KEY_EVENTS_CHANNEL
from deployments.errors import ActionError, NotAllowed
from deployments.models import ApiKey, Membership
from deployments.services.api_keys import (api_key_create, api_key_rotate, api_key_transfer_to_team,
                                           api_keys_revoke_for_person)
from deployments.services.credentials import credential_mint
from deployments.services.teams import membership_remove
from tests.factories import MembershipFactory, TeamFactory

pytestmark = pytest.mark.django_db


def live(*keys) -> list[bool]:
    return [ApiKey.objects.get(pk=k.pk).revoked_at is None for k in keys]


def test_a_key_belongs_to_whoever_creates_it_and_only_team_admins_create_team_keys(team, team_admin, member):
    mine, _ = api_key_create(actor=member, team=team, name="mine")
    assert mine.owner == member
    with pytest.raises(NotAllowed, match="Only admins of team ml-research can create team keys"):
        api_key_create(actor=member, team=team, name="service", team_key=True)
    assert not ApiKey.objects.filter(name="service").exists()
    service, _ = api_key_create(actor=team_admin, team=team, name="service", team_key=True)
    assert service.owner is None and service.created_by == team_admin
    created = team.events.filter(kind="api_key_created").order_by("pk")
    assert [e.after["owner"] for e in created] == [member.username, None]


def test_revoking_a_persons_keys_takes_what_they_own_in_the_team_named_and_tells_every_gateway(
        team, team_admin, member, redis_client, django_capture_on_commit_callbacks):
    other = TeamFactory(slug="other")
    MembershipFactory(team=other, user=member)
    here, _ = api_key_create(actor=member, team=team, name="here")
    there, _ = api_key_create(actor=member, team=other, name="there")
    moved, _ = api_key_create(actor=member, team=team, name="moved")
    api_key_transfer_to_team(actor=team_admin, key=moved)
    colleagues, _ = api_key_create(actor=team_admin, team=team, name="colleagues")
    listener = redis_client.pubsub()
    listener.subscribe(KEY_EVENTS_CHANNEL)
    listener.get_message(timeout=1)  # the subscription's confirmation

    with django_capture_on_commit_callbacks(execute=True):
        revoked = api_keys_revoke_for_person(actor=team_admin, user=member, message="Left.", team=team)

    assert revoked == [here.display]
    assert live(here, there, moved, colleagues) == [False, True, True, True]
    announced = listener.get_message(timeout=2)
    assert announced and announced["data"].decode() == here.key_id
    event = team.events.get(kind="api_key_revoked")
    assert (event.actor, event.message, event.before["key_id"]) == (team_admin, "Left.", here.key_id)

    # Without a team (Tandem deactivating the person): every key they still own, anywhere.
    assert api_keys_revoke_for_person(actor=None, user=member, message="Deactivated.") == [there.display]
    assert live(there, moved, colleagues) == [False, True, True]


def test_only_a_team_admin_moves_a_persons_key_to_the_team_and_it_stays_when_they_leave(team, team_admin, member):
    backend, _ = api_key_create(actor=member, team=team, name="backend")
    laptop, _ = api_key_create(actor=member, team=team, name="laptop")
    with pytest.raises(NotAllowed, match="Only admins of team ml-research"):
        api_key_transfer_to_team(actor=member, key=backend)
    outsider = MembershipFactory(team=TeamFactory(slug="other"), role=Membership.Role.ADMIN).user
    with pytest.raises(NotAllowed):
        api_key_transfer_to_team(actor=outsider, key=backend)
    assert ApiKey.objects.get(pk=backend.pk).owner == member

    api_key_transfer_to_team(actor=team_admin, key=backend, message="The chat service runs on it.")
    event = team.events.get(kind="api_key_transferred")
    assert (event.actor, event.message) == (team_admin, "The chat service runs on it.")
    assert (event.before["owner"], event.after["owner"], event.after["key_id"]) == (member.username, None,
                                                                                    backend.key_id)
    api_key_transfer_to_team(actor=team_admin, key=backend)  # already the team's: nothing to record
    assert team.events.filter(kind="api_key_transferred").count() == 1

    membership_remove(actor=team_admin, membership=Membership.objects.get(team=team, user=member))
    assert live(backend, laptop) == [True, False]
    assert ApiKey.objects.get(pk=backend.pk).owner is None


def test_a_revoked_key_is_not_moved(team, team_admin, member):
    key, _ = api_key_create(actor=member, team=team, name="old")
    api_keys_revoke_for_person(actor=team_admin, user=member, message="Rotated by hand.")
    with pytest.raises(ActionError, match="old is revoked"):
        api_key_transfer_to_team(actor=team_admin, key=key)
    assert ApiKey.objects.get(pk=key.pk).owner == member


def test_a_rotated_key_keeps_its_owner(team, team_admin, member):
    """An admin who rotates a member's key does not take it over: the replacement still goes when they go."""
    persons, _ = api_key_create(actor=member, team=team, name="backend")
    teams, _ = api_key_create(actor=team_admin, team=team, name="service", team_key=True)
    assert api_key_rotate(actor=team_admin, key=persons)[0].owner == member
    assert api_key_rotate(actor=team_admin, key=teams)[0].owner is None
    with pytest.raises(NotAllowed, match="Only the owner of service or an admin"):
        api_key_rotate(actor=member, key=ApiKey.objects.get(name="service", revoked_at=None))


def test_the_migration_gives_each_existing_key_to_its_creator(team, member):
    """Keys made before owners existed: a person's belongs to them (and goes when they go); one whose creator is
    gone, or Tandem's own, stays what it already was in effect, a key of the team."""
    from django.apps import apps

    owners_from_creators = importlib.import_module("deployments.migrations.0014_api_key_owner").owners_from_creators
    persons, _ = credential_mint(model=ApiKey, team=team, name="old", created_by=member)
    creator_gone, _ = credential_mint(model=ApiKey, team=team, name="orphan", created_by=None)
    owners_from_creators(apps, None)
    assert [ApiKey.objects.get(pk=k.pk).owner for k in (persons, creator_gone)] == [member, None]


def test_a_deleted_persons_key_does_not_become_a_team_key(team, team_admin, member):
    """Even a deletion that skips the services (a raw `user.delete()`) leaves no live key of theirs behind as if the
    team owned it: the key goes with the person."""
    theirs, _ = api_key_create(actor=member, team=team, name="theirs")
    service, _ = api_key_create(actor=member, team=team, name="service")
    api_key_transfer_to_team(actor=team_admin, key=service)
    member.delete()
    assert not ApiKey.objects.filter(pk=theirs.pk).exists()
    assert ApiKey.objects.get(pk=service.pk).revoked_at is None


@pytest.mark.django_db(transaction=True)
def test_a_key_moved_to_the_team_while_its_owner_leaves_is_not_revoked(team, team_admin, member):
    """The move commits while the leaver's revocation waits for the key's row: the revocation then sees a team key
    and leaves it (without the row lock it revoked the key the admin had just kept)."""
    key, _ = api_key_create(actor=member, team=team, name="chat-backend")
    moved, commit = threading.Event(), threading.Event()
    revoked = []

    def move():
        try:
            with transaction.atomic():
                api_key_transfer_to_team(actor=team_admin, key=key)
                moved.set()
                commit.wait(timeout=10)
        finally:
            connection.close()

    def leave():
        try:
            revoked.extend(api_keys_revoke_for_person(actor=None, user=member, message="Left."))
        finally:
            connection.close()

    mover = threading.Thread(target=move)
    mover.start()
    assert moved.wait(timeout=10)
    leaver = threading.Thread(target=leave)
    leaver.start()
    leaver.join(timeout=1)
    assert leaver.is_alive()  # waiting for the row the move holds
    commit.set()
    mover.join(timeout=10)
    leaver.join(timeout=10)
    assert revoked == []
    key.refresh_from_db()
    assert key.owner is None and key.revoked_at is None
