"""The portal behind the load balancer, as the EKS overlay ships it: the real web process (gunicorn, production
settings, the overlay's own proxy setting) behind the real balancer process (tests/support/balancer.py, which
sends X-Forwarded-Proto: https and appends the client's address to X-Forwarded-For as AWS's ALB does). The
balancer ends no TLS here; the requests carry the Origin a browser on the portal's https:// address sends."""
import re

import httpx
import pytest

from tests.controlplane.test_production_settings import run
from tests.deploy.render import find, render
from tests.factories import UserFactory
from tests.gateway.test_behind_balancer import BALANCER, FLOODER, NEIGHBOUR, VPC, ALB_RANGE_PLACEHOLDER
from tests.support.balancer import start_balancer
from tests.support.processes import start_web

pytestmark = pytest.mark.django_db(transaction=True)
LIMIT = 5  # settings.AXES_FAILURE_LIMIT
PASSWORD = "tidal-orchard-31-lantern"
# Addresses a client writes into its own X-Forwarded-For to pass for someone else.
FORGED = ("203.0.113.250", NEIGHBOUR, BALANCER, "127.0.1.9, 203.0.113.251")


def overlay_web_settings(vpc_cidr: str) -> dict:
    """The EKS overlay's proxy setting for the portal, with the ALB's subnets filled in as the install guide does."""
    data = find(render("eks"), "ConfigMap", "tandem-settings")["data"]
    name = "TANDEM_WEB_FORWARDED_ALLOW_IPS"
    return {name: data[name].replace(ALB_RANGE_PLACEHOLDER, vpc_cidr)} if name in data else {}


@pytest.fixture
def portal(tmp_path, redis_client):
    """The production web process behind the balancer, which connects from the "VPC"; yields the balancer."""
    web = start_web(tmp_path, DJANGO_SETTINGS_MODULE="controlplane.settings.production",
                    TANDEM_API_RATE_ANON="2/min", **overlay_web_settings(VPC))
    alb = start_balancer(tmp_path, upstream=web.base_url, source=BALANCER)
    alb.web = web
    yield alb
    alb.stop()
    web.stop()


def client_at(address: str, base_url: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, transport=httpx.HTTPTransport(local_address=address), timeout=30)


def sign_in(client: httpx.Client, web_host: str, username: str, password: str, forwarded_for: str | None = None):
    """The sign-in form, fetched and posted as a browser does (its Secure CSRF cookie sent back by hand: httpx
    keeps Secure cookies off plain HTTP)."""
    extra = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    page = client.get("/accounts/login/", headers=extra)
    assert page.status_code == 200, (page.status_code, page.headers.get("Location"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
    return client.post("/accounts/login/", data={"username": username, "password": password, "next": "/",
                                                 "csrfmiddlewaretoken": token},
                       headers={"Cookie": f"csrftoken={page.cookies['csrftoken']}",
                                "Origin": f"https://{web_host}", **extra})


def test_the_eks_overlay_has_the_portal_trust_the_vpc_as_the_gateway_does():
    data = find(render("eks"), "ConfigMap", "tandem-settings")["data"]
    assert data["TANDEM_WEB_FORWARDED_ALLOW_IPS"] == data["TANDEM_GATEWAY_FORWARDED_ALLOW_IPS"] == ALB_RANGE_PLACEHOLDER


@pytest.mark.parametrize("value, bad", [(ALB_RANGE_PLACEHOLDER, ALB_RANGE_PLACEHOLDER),
                                        ("10.0.0.0/16, 10.1.0.1/16", "10.1.0.1/16")])
def test_the_portal_refuses_to_start_with_a_range_it_cannot_use(value, bad):
    """The overlay's placeholder left in, or a CIDR with host bits set, would trust nothing without a word: every
    client would be the balancer and every page a redirect. The portal says so and does not start."""
    out = run(["manage.py", "check"], TANDEM_WEB_FORWARDED_ALLOW_IPS=value)
    assert out.returncode != 0
    assert (f"Refusing to start Tandem: TANDEM_WEB_FORWARDED_ALLOW_IPS has '{bad}', which is not an IP address or "
            "network") in out.stderr


def test_the_sign_in_page_loads_through_the_balancer_and_only_through_it(portal):
    """Through the balancer the page is served as HTTPS (200 with HSTS), not redirected to itself; a client that
    connects directly from outside the VPC claiming X-Forwarded-Proto: https is still plain HTTP to the portal and
    redirected. (gunicorn itself believes the header from 127.0.0.1, its default `forwarded_allow_ips`, which is
    why the client connects from another address.)"""
    with client_at(FLOODER, portal.base_url) as browser:
        page = browser.get("/accounts/login/")
    assert page.status_code == 200, (page.status_code, page.headers.get("Location"))
    assert 'name="password"' in page.text and page.headers["Strict-Transport-Security"].startswith("max-age=")
    with client_at(FLOODER, portal.web.base_url) as direct_client:
        direct = direct_client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
    assert direct.status_code == 301 and direct.headers["Location"].startswith("https://")


def test_wrong_passwords_lock_out_the_guesser_not_the_user_whatever_address_it_claims(portal, settings):
    """One client's wrong passwords for mia lock that client out for mia (429), whatever address it writes into
    X-Forwarded-For; mia herself, from another client through the same balancer, still signs in."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]  # production's, not MD5
    UserFactory(username="mia", password=PASSWORD)
    web_host = portal.web.base_url.removeprefix("http://")
    with client_at(FLOODER, portal.base_url) as guesser, client_at(NEIGHBOUR, portal.base_url) as mia:
        codes = [sign_in(guesser, web_host, "mia", f"guess-{i}").status_code for i in range(LIMIT)]
        assert codes == [200] * (LIMIT - 1) + [429]
        for claimed in FORGED:
            assert sign_in(guesser, web_host, "mia", PASSWORD, forwarded_for=claimed).status_code == 429, claimed
        signed_in = sign_in(mia, web_host, "mia", PASSWORD)
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/"
    assert "sessionid" in signed_in.cookies


def test_one_client_over_the_api_rate_does_not_use_up_another_clients(portal):
    """Anonymous API calls are counted per client (2 a minute here), not per balancer: the client over its rate
    stays over it whatever address it claims, and another client through the same balancer is served."""
    with client_at(FLOODER, portal.base_url) as flooder, client_at(NEIGHBOUR, portal.base_url) as neighbour:
        assert [flooder.get("/api/schema/").status_code for _ in range(3)] == [200, 200, 429]
        for claimed in FORGED:
            assert flooder.get("/api/schema/", headers={"X-Forwarded-For": claimed}).status_code == 429, claimed
        assert neighbour.get("/api/schema/").status_code == 200
