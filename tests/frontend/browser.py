"""Playwright plumbing for the portal's browser tests: Debian's chromium (never a downloaded browser)."""
import os
from pathlib import Path

import pytest

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is not installed: run ./tandem test, which installs it (apt-get install -y chromium)")
    # Playwright's sync API runs an event loop in this thread; the test also uses the ORM between steps.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()
        # Connections the test opened while Playwright's loop ran belong to that context: close them here, or
        # the test database cannot be dropped at the end of the session.
        from django.db import connections

        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def shot(page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def sign_in(browser, base_url: str, username: str, *, screenshot: str | None = None):
    """A fresh browser context (its own cookies) signed in as `username` (factory password "pw")."""
    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=base_url)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
    page = context.new_page()
    page.goto("/accounts/login/")
    if screenshot:
        shot(page, screenshot)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/deployments/")
    return context, page
