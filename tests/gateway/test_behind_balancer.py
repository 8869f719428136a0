"""The gateway behind a load balancer, as the EKS overlay ships it: real gateway processes behind a real balancer
process (tests/support/balancer.py, appending X-Forwarded-For as AWS's ALB does), the overlay's own settings, and
the gateway's refusal to start when those settings cannot tell one client from another."""
import subprocess
import sys

import httpx
import openai
import pytest
from django.conf import settings

from tests.deploy.render import ROOT, find, render
from tests.gateway.conftest import start_gateway
from tests.gateway.test_errors import CHAT, assert_openai_error
from tests.gateway.test_hostile import _made_up_keys, _metric
from tests.support.balancer import start_balancer
from tests.support.processes import free_port, wait_for, worker_environment

# The overlay's stand-in for the ALB's subnets (their CIDRs), which docs/install.md's step 6 replaces with `sed`.
ALB_RANGE_PLACEHOLDER = "REPLACE-ALB-SUBNET-CIDRS"
PROXY_SETTINGS = ("TANDEM_GATEWAY_BEHIND_LOAD_BALANCER", "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS")
# Here the "VPC" is 127.0.1.0/24: the balancer connects from 127.0.1.1, its clients from elsewhere in 127/8.
VPC, BALANCER, FLOODER, NEIGHBOUR = "127.0.1.0/24", "127.0.1.1", "127.0.0.2", "127.0.0.3"


def overlay_gateway_settings(vpc_cidr: str) -> dict:
    """The EKS overlay's proxy settings for the gateway, with the ALB's subnets filled in as the install guide does."""
    data = find(render("eks"), "ConfigMap", "tandem-settings")["data"]
    return {name: data[name].replace(ALB_RANGE_PLACEHOLDER, vpc_cidr) for name in PROXY_SETTINGS if name in data}


def test_the_eks_overlay_puts_the_gateway_behind_its_alb_trusting_the_vpc():
    data = find(render("eks"), "ConfigMap", "tandem-settings")["data"]
    assert data["TANDEM_GATEWAY_BEHIND_LOAD_BALANCER"] == "true"
    assert data["TANDEM_GATEWAY_FORWARDED_ALLOW_IPS"] == ALB_RANGE_PLACEHOLDER
    step = (ROOT / "docs" / "install.md").read_text().split("## 6.", 1)[1].split("## 7.", 1)[0]
    assert f's|{ALB_RANGE_PLACEHOLDER}|$ALB_SUBNET_CIDRS|" deploy/overlays/eks/settings.yaml' in step


def test_a_junk_key_flood_through_the_balancer_locks_out_only_the_flooder(world, tmp_path):
    """One client sends 60 made-up keys a minute through the balancer, claiming other addresses in its own
    X-Forwarded-For: it is refused (429), as whatever address it claims; a real key made after the flood, from
    another client, is served through the same balancer, and that client's typo is its own 401."""
    world.deployment("m")
    (_, fresh), (_, spare) = world.key(), world.key()
    gw = start_gateway(tmp_path, TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE="60", **overlay_gateway_settings(VPC))
    alb = start_balancer(tmp_path, upstream=gw.base_url, source=BALANCER)
    flooder = httpx.Client(base_url=alb.base_url, transport=httpx.HTTPTransport(local_address=FLOODER), timeout=20)
    neighbour = httpx.Client(transport=httpx.HTTPTransport(local_address=NEIGHBOUR), timeout=20)
    try:
        junk = _made_up_keys(60)
        for i, guess in enumerate(junk):
            assert_openai_error(flooder.post("/v1/chat/completions", json={"model": "m", **CHAT}, headers={
                "Authorization": f"Bearer {guess}", "X-Forwarded-For": f"203.0.113.{i}"}), 401)
        for claimed in ("203.0.113.250", NEIGHBOUR, BALANCER, "127.0.1.9, 203.0.113.251"):
            r = flooder.post("/v1/chat/completions", json={"model": "m", **CHAT},
                             headers={"Authorization": f"Bearer {junk[0]}", "X-Forwarded-For": claimed})
            assert_openai_error(r, 429, "too_many_auth_failures")
        client = openai.OpenAI(base_url=f"{alb.base_url}/v1", api_key=fresh, max_retries=0, http_client=neighbour)
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content.startswith("tok0 ")
        typo = spare[:-1] + ("A" if spare[-1] != "A" else "B")  # a key the gateway has not seen: checked, refused
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{alb.base_url}/v1", api_key=typo, max_retries=0,
                          http_client=neighbour).models.list()
    finally:
        flooder.close()
        neighbour.close()
        alb.stop()
        gw.stop()


def test_a_balancer_header_from_an_untrusted_peer_is_counted_logged_once_and_not_believed(world, tmp_path):
    """A request that carries X-Forwarded-For or X-Amzn-Trace-Id but comes straight from a peer outside the
    trusted range: counted, logged once, and its failures counted against that peer whatever the header says."""
    world.deployment("m")
    gw = start_gateway(tmp_path, TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE="4", TANDEM_GATEWAY_FORWARDED_ALLOW_IPS=VPC)
    try:
        url = gw.base_url + "/v1/chat/completions"
        trace = {"X-Amzn-Trace-Id": "Root=1-5f84c7a9-0123456789abcdef01234567"}
        for headers in ({"X-Forwarded-For": "203.0.113.1"}, trace, {"X-Forwarded-For": "203.0.113.2"}, {}):
            assert_openai_error(httpx.post(url, json={"model": "m", **CHAT},
                                           headers={"Authorization": "Bearer junk", **headers}), 401)
        assert _metric(gw, "tandem_gateway_untrusted_forwarded_total") == 3
        r = httpx.post(url, json={"model": "m", **CHAT},
                       headers={"Authorization": "Bearer junk", "X-Forwarded-For": "203.0.113.3"})
        assert_openai_error(r, 429, "too_many_auth_failures")  # 127.0.0.1 is past its 4; 203.0.113.3 had none
        wait_for(lambda: "not in TANDEM_GATEWAY_FORWARDED_ALLOW_IPS" in gw.log.read_text(), timeout=5,
                 what="the warning in the gateway's log")
        assert gw.log.read_text().count("not in TANDEM_GATEWAY_FORWARDED_ALLOW_IPS") == 1
    finally:
        gw.stop()


@pytest.mark.parametrize("env, reason", [
    ({"TANDEM_GATEWAY_BEHIND_LOAD_BALANCER": "true"}, "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS is empty"),
    ({"TANDEM_GATEWAY_BEHIND_LOAD_BALANCER": "true", "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS": ALB_RANGE_PLACEHOLDER},
     f"has '{ALB_RANGE_PLACEHOLDER}', which is not an IP address or network"),
    ({"TANDEM_GATEWAY_FORWARDED_ALLOW_IPS": "10.0.0.0/16, 10.1.0.1/16"}, "has '10.1.0.1/16', which is not"),
])
def test_the_gateway_refuses_to_start_when_it_could_not_tell_clients_apart(tmp_path, env, reason):
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(free_port())],
                            env=worker_environment(tmp_path, TANDEM_KEY_HMAC_SECRET=settings.TANDEM_KEY_HMAC_SECRET,
                                                   TANDEM_GATEWAY_METRICS_PORT=str(free_port()), **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert out.strip().splitlines()[-1].startswith("Refusing to start the gateway: ") and reason in out, out
