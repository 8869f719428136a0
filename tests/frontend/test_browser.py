"""The portal in a real browser (Playwright + Debian's chromium) against a live server.

A member requests a deployment, a team admin approves it in another browser context, the member watches the
timeline update live to `running`, creates an API key and copies it, and sees latency, usage and the real
conformance run's result.

A real Celery worker drives the approved deployment onto a Kubernetes API emulator (KubeRay's CRD installed)
through the `kubernetes` target; traffic is written as the gateway records it and rolled up with the
observability module's own `gateway_rollup`.
"""
import datetime as dt
import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from deployments.lifecycle import Status
from deployments.models import ApiKey, Cluster, Deployment, Membership
from deployments.services.credentials import credential_check
from observability.models import ConformanceRun
from observability.rollups import gateway_rollup
from tests.factories import MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, MembershipFactory, TeamFactory, UserFactory
from tests.support.processes import Worker, wait_for, worker_environment
from tests.frontend.browser import browser, shot, sign_in  # noqa: F401  (fixture)
from usage.models import RequestRecord

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def record_traffic(d: Deployment, key: ApiKey) -> None:
    """Requests as the gateway records them, rolled up by the observability code; the portal reads them through
    the REST APIs."""
    now = timezone.now()
    for i in range(24):
        RequestRecord.objects.create(
            request_id=f"req-{i}", deployment=d, api_key=key, created_at=now - dt.timedelta(minutes=i % 12, seconds=5),
            endpoint="chat.completions", stream=True, status_code=200, prompt_tokens=900 + 10 * i,
            completion_tokens=200 + i, ttft_ms=60 + 3 * i, e2e_ms=480 + 20 * i, mean_itl_ms=11 + i / 10)
    gateway_rollup(since=now - dt.timedelta(minutes=15), until=now + dt.timedelta(minutes=1))


@pytest.fixture
def worker(transactional_db, redis_client, tmp_path):
    """A real Celery worker on the test database: it reconciles the approved deployment."""
    w = Worker(worker_environment(tmp_path)).start()
    yield w
    w.stop()


def test_request_approve_watch_and_key(browser, live_server, worker, kubeconfig):  # noqa: F811
    team = TeamFactory(slug="ml-research", name="ML Research", gpu_quota=16)
    MembershipFactory(team=team, user=UserFactory(username="mia"), role=Membership.Role.MEMBER)
    MembershipFactory(team=team, user=UserFactory(username="ada"), role=Membership.Role.ADMIN)
    ClusterFactory(name="gpu-prod", kind=Cluster.Kind.KUBERNETES, secret_ref=kubeconfig,
                   config={"namespace_prefix": "tandem-", "model_sources": MODEL_SOURCES,
                           "runtime_images": RUNTIME_IMAGES})
    base = live_server.url

    # 1. The member signs in and sees an empty list that says what to do.
    member_ctx, page = sign_in(browser, base, "mia", screenshot="01-sign-in")
    assert page.get_by_role("heading", name="No deployments yet").is_visible()
    shot(page, "02-deployments-empty")

    # 2. The request form: defaults follow the instance type; errors show next to fields as the user types.
    page.get_by_role("link", name="+ New deployment").click()
    page.get_by_label("Name", exact=True).fill("chat-8b")
    page.get_by_label("Model name").fill("llama-3-8b")
    page.get_by_label("Weights", exact=True).fill("s3://models/llama-3-8b")
    page.locator("#id_decode_instance_type").select_option("p5.48xlarge")
    assert page.locator("#id_decode_gpus_per_node").input_value() == "8"
    assert page.locator("#id_decode_tensor_parallel_size").input_value() == "8"
    for label, value in (("Layers", "32"), ("Hidden size", "4096"), ("Attention heads", "32"), ("KV heads", "8"),
                         ("Head dim", "128"), ("Parameters", "8030261248")):
        page.get_by_label(label, exact=True).fill(value)
    page.locator("#plan-panel .verdict").wait_for()
    page.locator("#id_prefill_tensor_parallel_size").fill("3")
    error = page.locator("#err-prefill_tensor_parallel_size")
    error.get_by_text("does not divide the 4 GPUs per node").wait_for()
    assert page.locator("#id_prefill_tensor_parallel_size").get_attribute("aria-invalid") == "true"
    page.locator("#plan-panel").get_by_text("GPUs requested").wait_for()
    assert "12" in page.locator("#plan-panel .big").inner_text()
    shot(page, "03-request-form-inline-error")
    page.locator("#id_prefill_tensor_parallel_size").fill("4")
    # (No wait_for_function: Playwright evaluates its predicate as a string, which the page's CSP refuses.)
    expect(page.locator("#err-prefill_tensor_parallel_size")).to_have_text("")
    shot(page, "04-request-form")
    # A click lost to a layout jump would leave us on the form (Chrome's scroll anchoring did that once).
    page.get_by_role("button", name="Request deployment").click()
    page.wait_for_url(re.compile(r"/deployments/\d+/$"))
    d = Deployment.objects.get(name="chat-8b")
    assert d.status == Status.PENDING_APPROVAL and d.spec["decode"]["instance_type"] == "p5.48xlarge"
    assert page.locator("[data-status]").get_attribute("data-status") == "pending_approval"
    shot(page, "05-detail-pending")

    # 3. The admin approves in another browser context, with a comment.
    admin_ctx, admin = sign_in(browser, base, "ada")
    admin.get_by_role("link", name="Approvals").click()
    admin.get_by_role("heading", name="chat-8b in ML Research").wait_for()
    shot(admin, "06-approvals")
    admin.get_by_label("Comment").fill("Approved for the support pilot.")
    admin.get_by_role("button", name="Approve").click()
    admin.get_by_text("Approved chat-8b.").wait_for()
    assert admin.get_by_role("heading", name="Nothing waits for you").is_visible()

    # 4. The member's page updates by itself: the decision, then the worker's steps, then running.
    page.locator("#status-panel").get_by_text("Approved for the support pilot.").first.wait_for(timeout=15000)
    polls = []
    page.on("request", lambda r: polls.append(r.url) if r.url.endswith("/status/") else None)
    page.locator("[data-status=running]").wait_for(timeout=90000)
    timeline = page.locator(".timeline").inner_text()
    for step in ("Requested", "Approved", "Provisioning", "Node pools", "Applied to the cluster", "Serve status",
                 "Endpoint check", "Running"):
        assert step in timeline, step
    assert page.locator(".live").count() == 0  # the panel says it is no longer live...
    settled_polls = len(polls)
    page.wait_for_timeout(4500)
    assert len(polls) == settled_polls  # ...and htmx stopped polling after the 286

    # 5. The member creates an API key and copies it; it is shown once.
    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("support-bot")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").input_value()
    key = credential_check(model=ApiKey, raw=secret)
    assert secret.startswith("tdm_") and key.name == "support-bot"
    page.locator("section.secret").get_by_role("button", name="Copy").click()
    page.get_by_role("button", name="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    shot(page, "08-api-key-created")
    page.goto("/keys/")
    assert secret not in page.content() and page.locator("#new-secret").count() == 0

    # 6. Traffic through the gateway shows as latency, throughput and usage by key; conformance has run.
    record_traffic(Deployment.objects.get(pk=d.pk), key)
    wait_for(lambda: ConformanceRun.objects.filter(deployment_id=d.pk).exists(), timeout=60, what="conformance run")
    page.goto(f"/deployments/{d.pk}/")
    page.locator("[data-latency-panel][data-rendered=true]").wait_for()
    datasets = page.evaluate("window.tandemCharts.latency.data.datasets.map(d => d.label)")
    assert any(label.startswith("TTFT") for label in datasets) and any(label.startswith("End-to-end") for label in datasets)
    points = page.evaluate("window.tandemCharts.latency.data.datasets.flatMap(d => d.data).filter(v => v).length")
    assert points > 0
    page.get_by_role("button", name="p99").click()
    assert page.evaluate("window.tandemCharts.latency.options.scales.y.title.text").startswith("p99")
    page.get_by_role("button", name="p95").click()
    usage = page.locator("[data-usage-panel]")
    usage.get_by_text("support-bot").wait_for()
    headers = [h.strip() for h in usage.locator("thead th").all_text_contents()]  # DOM text: CSS uppercases it
    cells = usage.locator("tbody tr").filter(has=page.get_by_text("support-bot", exact=True)).locator("td")
    assert cells.nth(headers.index("Requests")).text_content().strip() == "24"  # requests made with the key
    # The worker ran the real conformance suite once the deployment was running; no gateway runs in this test,
    # so the portal must show it failing, check by check, rather than looking fine.
    conformance = page.locator("[data-conformance-panel]")
    conformance.get_by_text("Checks failed").wait_for(timeout=30000)
    assert "models_list" in conformance.inner_text()
    page.get_by_role("tab", name="curl").click()
    assert page.locator("#snip-curl").is_visible() and not page.locator("#snip-py").is_visible()
    page.get_by_role("tab", name="Python").click()
    shot(page, "07-detail-running")

    # 7. The remaining pages, for the record.
    page.get_by_role("link", name="Team", exact=True).click()
    page.get_by_role("heading", name="Members").wait_for()
    shot(page, "09-team")
    page.get_by_role("link", name="Access tokens").click()
    page.get_by_label("Name").fill("ci")
    page.get_by_role("button", name="Create token").click()
    assert page.locator("#new-secret").input_value().startswith("tdp_")
    shot(page, "10-access-token-created")
    page.goto("/deployments/")
    shot(page, "11-deployments-list")
    page.goto(f"/deployments/{d.pk}/delete/")
    shot(page, "12-delete-confirm")
    admin.goto("/approvals/")
    shot(admin, "13-approvals-empty")
    member_ctx.close()
    admin_ctx.close()


# Registered before any page script runs: every CSP violation the browser reports is kept on the window.
CSP_LISTENER = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", e => window.__csp.push(
  `${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile || location.pathname}:${e.lineNumber}`));
"""


def test_every_page_runs_under_the_content_security_policy(browser, live_server):  # noqa: F811
    """The portal, the admin, the sign-in pages and the API docs in Chromium with the CSP enforced: each response
    carries the policy, and no script, style or request is refused (htmx swaps, charts, copy buttons included)."""
    from deployments.services.api_keys import api_key_create
    from tests.factories import DeploymentFactory

    team = TeamFactory(slug="ml-research", name="ML Research", gpu_quota=16)
    admin = UserFactory(username="ada", is_staff=True, is_superuser=True)
    MembershipFactory(team=team, user=admin, role=Membership.Role.ADMIN)
    UserFactory(username="mia")
    pending = DeploymentFactory(team=team, requested_by=admin, name="chat-8b")
    running = DeploymentFactory(team=team, requested_by=admin, name="chat-70b", status=Status.RUNNING)
    key, _ = api_key_create(actor=admin, team=team, name="support-bot")
    record_traffic(running, key)

    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=live_server.url)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    context.add_init_script(CSP_LISTENER)
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(str(e)))
    seen: dict[str, list[str]] = {}

    def visit(path: str, *, ready: str | None = None, then=None):
        response = page.goto(path)
        policy = response.headers.get("content-security-policy", "")
        assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe" not in policy, path
        if ready:
            page.locator(ready).first.wait_for()
        if then:
            then()
        page.wait_for_load_state("networkidle")
        seen[path] = page.evaluate("window.__csp")

    # Sign-in, including the page a locked-out user sees.
    for _ in range(5):
        visit("/accounts/login/", then=lambda: (page.get_by_label("Username").fill("mia"),
                                               page.get_by_label("Password").fill("wrong-guess"),
                                               page.get_by_role("button", name="Sign in").click()))
    assert page.get_by_text("Too many wrong passwords").is_visible()
    seen["locked out"] = page.evaluate("window.__csp")
    visit("/accounts/login/", then=lambda: (page.get_by_label("Username").fill("ada"),
                                           page.get_by_label("Password").fill("pw"),
                                           page.get_by_role("button", name="Sign in").click(),
                                           page.wait_for_url("**/deployments/")))

    def request_form():
        page.get_by_label("Name", exact=True).fill("tiny")
        page.get_by_label("Model name").fill("llama-3-8b")
        page.locator("#id_prefill_tensor_parallel_size").fill("3")  # an htmx round trip swaps errors in
        page.locator("#err-prefill_tensor_parallel_size").get_by_text("does not divide").wait_for()
        page.locator("#plan-panel .meter svg").first.wait_for()

    def create_key():
        page.get_by_label("Name").fill("ci-bot")
        page.get_by_role("button", name="Create key").click()
        page.locator("#new-secret").focus()
        page.locator("section.secret").get_by_role("button", name="Copy").click()
        page.get_by_role("button", name="Copied").wait_for()

    visit("/deployments/", ready="text=chat-70b")
    visit("/deployments/new/", then=request_form)
    visit(f"/deployments/{pending.pk}/", ready="[data-status=pending_approval]")
    visit(f"/deployments/{running.pk}/", ready="[data-latency-panel][data-rendered=true]",
          then=lambda: page.get_by_role("tab", name="curl").click())
    visit(f"/deployments/{running.pk}/delete/")
    visit("/approvals/", ready=".meter svg")
    visit("/keys/", then=create_key)
    visit("/tokens/")
    visit("/team/", ready=".meter svg")
    visit("/accounts/password_change/")
    visit("/admin/")
    visit("/admin/deployments/deployment/")
    visit(f"/admin/auth/user/{admin.pk}/change/")
    visit("/api/docs/", ready=".opblock")  # Swagger UI from the sidecar package, running
    assert page.locator(".opblock").count() > 10

    assert {path: v for path, v in seen.items() if v} == {}
    assert [m for m in console if "Content Security Policy" in m or "Refused" in m] == []
    context.close()
