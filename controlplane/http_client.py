"""Plain HTTP clients (metrics scrapes, probes) with one timeout policy, built in one place.

A client is not shared across calls: its pooled sockets must not cross a Celery prefork fork, and httpx has no
pid check. Each caller owns the client it gets and closes it (`with http_client() as client:`).
"""
import httpx

SCRAPE_TIMEOUT = httpx.Timeout(10.0)


def http_client(*, timeout: httpx.Timeout = SCRAPE_TIMEOUT) -> httpx.Client:
    """A new httpx client with no base URL or credentials; close it when done."""
    return httpx.Client(timeout=timeout)
