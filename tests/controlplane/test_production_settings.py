"""Production settings are what every entry point runs outside `./tandem up` and the tests: HTTPS only, the
proxy's headers believed only behind the proxy, and never DEBUG at an address other machines can reach."""
import os
import secrets
import subprocess
import sys

import pytest

from tests.support.processes import ROOT

SHOW_SETTINGS = "from django.conf import settings; print(settings.SETTINGS_MODULE)"


def run(args: list[str], **env) -> subprocess.CompletedProcess:
    """A fresh process with no settings module chosen and production's secrets set (they have no default)."""
    base = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DJANGO_DEBUG"}}
    base |= {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "TANDEM_KEY_HMAC_SECRET": secrets.token_urlsafe(32)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=base | env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("entry", ["controlplane.wsgi", "controlplane.asgi", "controlplane.celery"])
def test_each_entry_point_defaults_to_production(entry):
    out = run(["-c", f"import {entry}; {SHOW_SETTINGS}"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("controlplane.settings.production")


def test_manage_py_defaults_to_production():
    out = run(["manage.py", "shell", "-c", SHOW_SETTINGS])
    assert out.returncode == 0 and out.stdout.strip().endswith("controlplane.settings.production"), out.stderr


def test_the_gateway_defaults_to_production():
    out = run(["-m", "gateway", "--port", "0"], DJANGO_DEBUG="1", TANDEM_GATEWAY_HOST="0.0.0.0")
    assert out.returncode != 0 and "Tandem (production settings) with DEBUG on at 0.0.0.0" in out.stderr


@pytest.mark.parametrize("env", [{"TANDEM_WEB_BIND": "0.0.0.0:8800"}, {"TANDEM_WEB_BIND": "10.1.2.3:8800"},
                                 {"TANDEM_GATEWAY_HOST": "0.0.0.0"}, {"TANDEM_GATEWAY_HOST": "::"}])
def test_production_refuses_debug_at_a_public_address(env):
    out = run(["manage.py", "check"], DJANGO_DEBUG="1", **env)
    assert out.returncode != 0
    assert "Refusing to start Tandem (production settings) with DEBUG on at" in out.stderr
    assert "Turn DEBUG off (unset DJANGO_DEBUG), or bind to 127.0.0.1" in out.stderr
    assert run(["manage.py", "check"], **env).returncode == 0  # DEBUG off: fine


def test_production_allows_debug_on_loopback_only():
    out = run(["manage.py", "check"], DJANGO_DEBUG="1", TANDEM_WEB_BIND="127.0.0.1:8800")
    assert out.returncode == 0, out.stderr


# 192.0.2.1 (TEST-NET-1) is public but on no interface here: a server that wrongly starts fails to bind at once.
@pytest.mark.parametrize("command, what", [
    (["-m", "gunicorn", "controlplane.wsgi", "-b", "192.0.2.1:8800"], "the web app (gunicorn)"),
    (["-m", "gateway", "--host", "192.0.2.1", "--port", "8801"], "the gateway"),
    (["manage.py", "runserver", "192.0.2.1:8800"], "runserver"),
])
def test_servers_refuse_debug_at_a_public_address_in_any_settings(command, what):
    out = run(command, DJANGO_SETTINGS_MODULE="controlplane.settings.local")  # local turns DEBUG on
    assert out.returncode != 0 and f"Refusing to start {what} with DEBUG on at 192.0.2.1" in out.stderr + out.stdout


def test_production_passes_djangos_deployment_checks():
    out = run(["manage.py", "check", "--deploy"])
    assert out.returncode == 0, out.stderr
    warned = {line.split(")")[0].split("(")[1] for line in out.stderr.splitlines() if "(security." in line}
    # Left to the operator: whether every subdomain is HTTPS too, and browser preload lists.
    assert warned <= {"security.W005", "security.W021"}, out.stderr


def test_https_settings_and_the_proxy_header_only_behind_the_proxy():
    show = ("from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
            "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER, "
            "s.REST_FRAMEWORK['NUM_PROXIES'], bool(s.SECURE_CSP))")
    direct = run(["manage.py", "shell", "-c", show])
    assert direct.stdout.split()[-7:] == ["True", "31536000", "True", "True", "None", "0", "True"], direct.stderr
    proxied = run(["manage.py", "shell", "-c", show], TANDEM_ONLY_BEHIND_PROXY="1")
    assert "('HTTP_X_FORWARDED_PROTO', 'https') 1 True" in proxied.stdout, proxied.stderr
