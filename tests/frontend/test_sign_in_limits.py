"""Password guessing is limited (django-axes) on both sign-in pages, and weak passwords are refused on change."""
import pytest
from django.contrib.auth import get_user_model

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
LIMIT = 5  # settings.AXES_FAILURE_LIMIT


def guess(client, url: str, username: str, password: str):
    return client.post(url, {"username": username, "password": password, "next": "/"})


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_wrong_passwords_lock_the_username_out_and_say_so(client, url):
    user = UserFactory(username="mia", is_staff=True)
    for _ in range(LIMIT - 1):
        assert guess(client, url, "mia", "wrong-guess").status_code == 200  # the form again, with its error
    locked = guess(client, url, "mia", "wrong-guess")
    page = locked.content.decode()
    assert locked.status_code == 429 and locked["Retry-After"] == "900"
    assert "Too many wrong passwords for <strong>mia</strong>" in page and "paused for 15 minutes" in page
    # Now even the right password is refused, on either page, until the cool-off passes or an admin unlocks it.
    for page_url in ("/accounts/login/", "/admin/login/"):
        assert guess(client, page_url, "mia", "pw").status_code == 429
    assert "_auth_user_id" not in client.session
    user.refresh_from_db()
    assert user.last_login is None


def test_the_lock_is_for_that_username_only(client):
    UserFactory(username="mia")
    UserFactory(username="ada")
    for _ in range(LIMIT):
        guess(client, "/accounts/login/", "mia", "wrong-guess")
    response = guess(client, "/accounts/login/", "ada", "pw")
    assert response.status_code == 302 and client.session["_auth_user_id"]


def test_a_right_password_clears_earlier_mistakes(client):
    UserFactory(username="mia")
    for _ in range(LIMIT - 1):
        guess(client, "/accounts/login/", "mia", "wrong-guess")
    assert guess(client, "/accounts/login/", "mia", "pw").status_code == 302
    client.post("/accounts/logout/")
    for _ in range(LIMIT - 1):
        assert guess(client, "/accounts/login/", "mia", "wrong-guess").status_code == 200


@pytest.mark.parametrize("weak, why", [
    ("short1!", "too short"),
    ("password1234", "too common"),
    ("318420993157", "entirely numeric"),
    ("mia-hartmann-1", "too similar to the username"),
])
def test_a_weak_password_is_refused_on_change(signed_in, weak, why):
    user = UserFactory(username="mia-hartmann")
    client = signed_in(user)
    response = client.post("/accounts/password_change/", {"old_password": "pw", "new_password1": weak,
                                                          "new_password2": weak})
    assert response.status_code == 200 and why in response.content.decode()
    user.refresh_from_db()
    assert user.check_password("pw")


def test_a_strong_password_is_accepted_on_change(signed_in):
    user = UserFactory(username="mia")
    response = signed_in(user).post("/accounts/password_change/", {
        "old_password": "pw", "new_password1": "tidal-orchard-31-lantern", "new_password2": "tidal-orchard-31-lantern"})
    assert response.status_code == 302 and response["Location"] == "/accounts/password_change/done/"
    user.refresh_from_db()
    assert user.check_password("tidal-orchard-31-lantern")


def test_a_weak_password_is_refused_when_an_admin_sets_one(signed_in, platform_admin):
    response = signed_in(platform_admin).post("/admin/auth/user/add/", {
        "username": "newcomer", "password1": "12345678", "password2": "12345678", "usable_password": "true"})
    assert response.status_code == 200 and "This password is too short" in response.content.decode()
    assert not get_user_model().objects.filter(username="newcomer").exists()
