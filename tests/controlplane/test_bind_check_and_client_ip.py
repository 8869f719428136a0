"""Which bind addresses other machines can reach, and whose word the client address is."""
import pytest
from django.test import RequestFactory, override_settings

from controlplane.bind_check import bind_host, host_is_public
from controlplane.client_ip import client_ip


@pytest.mark.parametrize("bind, public", [
    ("127.0.0.1:8800", False), ("localhost:8800", False), ("[::1]:8800", False), ("unix:/run/tandem.sock", False),
    ("0.0.0.0:8800", True), ("[::]:8800", True), ("10.0.0.5:8800", True), ("tandem.internal:8800", True),
    ("0.0.0.0", True), ("127.0.0.1", False),
])
def test_which_binds_other_machines_can_reach(bind, public):
    assert host_is_public(bind_host(bind)) is public


def test_the_client_address_is_the_proxys_word_only_behind_the_proxy():
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.4")
    assert client_ip(request) == "10.0.0.2"
    with override_settings(REST_FRAMEWORK={"NUM_PROXIES": 1}):
        assert client_ip(request) == "198.51.100.4"  # the one the proxy appended, not the one the client wrote
