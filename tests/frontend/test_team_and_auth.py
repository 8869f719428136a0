"""Sign in and out, the team switcher, and the team page."""
import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.models import Membership
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_sign_in_page_and_sign_in(client, member):
    page = client.get("/accounts/login/").content.decode()
    assert '<label for="id_username">Username</label>' in page and "csrfmiddlewaretoken" in page
    response = client.post("/accounts/login/", {"username": member.username, "password": "pw"})
    assert response.status_code == 302 and response["Location"] == "/"


def test_bad_password_says_so(client, member):
    page = client.post("/accounts/login/", {"username": member.username, "password": "nope"}).content.decode()
    assert 'role="alert"' in page and "correct username and password" in page


def test_sign_out(signed_in, member):
    client = signed_in(member)
    page = client.get(reverse("frontend:deployments")).content.decode()
    assert 'action="/accounts/logout/"' in page
    assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"
    assert client.get(reverse("frontend:deployments")).status_code == 302


def test_team_switcher_keeps_the_choice_in_the_session(signed_in, member, other_team, cluster, team):
    MembershipFactory(team=other_team, user=member)
    DeploymentFactory(team=other_team, cluster=cluster, requested_by=member, name="other-dep")
    client = signed_in(member)
    assert "other-dep" not in client.get("/deployments/").content.decode()
    response = client.post(reverse("frontend:team-switch"), {"team": "other-team", "next": "/keys/"})
    assert response["Location"] == "/keys/"
    page = client.get("/deployments/").content.decode()
    assert "other-dep" in page and '<option value="other-team" selected>' in page


def test_the_team_a_page_shows_in_the_switcher_is_the_team_the_next_page_uses(signed_in, platform_admin, cluster):
    """A platform admin in a fresh session opens a Demo team deployment: the switcher and the title say Demo team,
    and Cost and Deployments (no team in their URLs) then show Demo team's, not Blue team's (the first by slug)."""
    blue, demo = TeamFactory(slug="blue", name="Blue team"), TeamFactory(slug="demo", name="Demo team")
    d = DeploymentFactory(team=demo, cluster=cluster, name="tiny-llama", status=Status.RUNNING)
    DeploymentFactory(team=blue, cluster=cluster, name="blue-chat", status=Status.RUNNING)
    client = signed_in(platform_admin)
    page = client.get(reverse("frontend:deployment-detail", args=[d.pk])).content.decode()
    assert "<title>tiny-llama · Demo team · Tandem</title>" in page and '<option value="demo" selected>' in page
    cost = client.get(reverse("frontend:team-cost")).content.decode()
    assert "<title>Cost · Demo team · Tandem</title>" in cost and '<option value="demo" selected>' in cost
    assert 'href="/api/v1/teams/demo/spend/?format=csv' in cost and "/api/v1/teams/blue/" not in cost
    listed = client.get(reverse("frontend:deployments")).content.decode()
    assert "<title>Deployments · Demo team · Tandem</title>" in listed
    assert "tiny-llama" in listed and "blue-chat" not in listed
    # The switcher still chooses: Blue team from then on, until a page shows another.
    client.post(reverse("frontend:team-switch"), {"team": "blue", "next": "/deployments/"})
    assert "<title>Cost · Blue team · Tandem</title>" in client.get(reverse("frontend:team-cost")).content.decode()


def test_switching_to_a_team_you_are_not_in_is_404(signed_in, member, other_team):
    assert signed_in(member).post(reverse("frontend:team-switch"), {"team": "other-team"}).status_code == 404


def test_switch_refuses_an_offsite_next(signed_in, member):
    response = signed_in(member).post(reverse("frontend:team-switch"),
                                      {"team": "ml-research", "next": "https://evil.example/"})
    assert response["Location"] == "/deployments/"


def test_team_page_members_roles_quota_usage(signed_in, member, team_admin, team, cluster):
    DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="big", status=Status.RUNNING)
    page = signed_in(member).get(reverse("frontend:team")).content.decode()
    assert member.username in page and team_admin.username in page
    assert '<span class="badge plain info">Admin</span>' in page and '<span class="badge plain mute">Member</span>' in page
    assert "8 of 16 GPUs held" in page and "big" in page


def test_a_user_in_no_team_is_told_how_to_get_in(client):
    user = UserFactory()
    client.force_login(user)
    assert Membership.objects.filter(user=user).count() == 0
    for url in ("/deployments/", "/deployments/new/", "/keys/", "/team/"):
        response = client.get(url)
        assert response.status_code == 403 and "You are not in a team yet" in response.content.decode(), url
    assert client.get("/tokens/").status_code == 200
