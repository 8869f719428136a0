"""The revocation check shared by the API's and Django admin's tests: running gateways refuse a key in time."""
import time

import httpx


def assert_key_refused_within(base_urls: list[str], raw_key: str, revoke, *, seconds: float) -> None:
    """Every gateway accepts `raw_key` (so it holds the key in its cache), then answers 401 for it within
    `seconds` of `revoke()` returning."""
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {raw_key}"}) for url in base_urls]
    try:
        for c in clients:
            assert c.get("/v1/models").status_code == 200, f"{c.base_url} refuses the key before it is revoked"
        revoke()
        deadline = time.monotonic() + seconds
        for c in clients:
            while c.get("/v1/models").status_code != 401:
                assert time.monotonic() < deadline, f"{c.base_url} still accepts the key {seconds} s after revocation"
                time.sleep(0.02)
    finally:
        for c in clients:
            c.close()
