"""The deployments list, the detail page, its live status panel and the lifecycle actions."""
import pytest
from django.urls import reverse

from deployments.lifecycle import Status
from deployments.services.actions import deployment_transition
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db


def detail(d):
    return reverse("frontend:deployment-detail", args=[d.pk])


def status_url(d):
    return reverse("frontend:deployment-status", args=[d.pk])


def test_pages_need_sign_in(client, deployment):
    for url in [reverse("frontend:deployments"), detail(deployment), reverse("frontend:approvals"),
                reverse("frontend:api-keys"), reverse("frontend:tokens"), reverse("frontend:team")]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url


def test_home_redirects_to_deployments(signed_in, member):
    assert signed_in(member).get("/")["Location"] == reverse("frontend:deployments")


def test_list_shows_team_deployments_with_badges(signed_in, member, deployment):
    page = signed_in(member).get(reverse("frontend:deployments")).content.decode()
    assert "chat-8b" in page and 'class="badge wait"' in page and "Pending Approval" in page
    assert 'hx-headers=\'{"X-CSRFToken": "' in page  # CSRF for every htmx request


def test_a_paused_deployment_reads_the_same_in_the_list_as_on_its_page(signed_in, member, team, cluster):
    """The list's badge and the detail page's status panel take their tone from one table: a paused deployment
    waits for a wake on both (the list's own copy once showed it as work in flight)."""
    DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="sleepy", status=Status.PAUSED)
    page = signed_in(member).get(reverse("frontend:deployments")).content.decode()
    row = page[page.index(">sleepy<"):]
    assert row[:row.index("</tr>")].count('class="badge wait"') == 1


def test_list_empty_state_says_what_to_do(signed_in, member):
    page = signed_in(member).get(reverse("frontend:deployments")).content.decode()
    assert "No deployments yet" in page and "Request your first deployment" in page


def test_list_filters_without_js_and_partial_with_htmx(signed_in, member, deployment, cluster, team, htmx_headers):
    DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="embed-small", status=Status.RUNNING)
    client = signed_in(member)
    page = client.get(reverse("frontend:deployments"), {"status": "running"}).content.decode()
    assert "embed-small" in page and "chat-8b" not in page and "<html" in page
    fragment = client.get(reverse("frontend:deployments"), {"q": "chat"},
                          headers=htmx_headers("deployment-table")).content.decode()
    assert "<html" not in fragment and fragment.strip().startswith('<div id="deployment-table"')
    assert "chat-8b" in fragment and "embed-small" not in fragment
    none = client.get(reverse("frontend:deployments"), {"cluster": "nowhere"}).content.decode()
    assert "No deployments match these filters" in none


def test_list_shows_only_the_current_team(signed_in, outsider, deployment):
    page = signed_in(outsider).get(reverse("frontend:deployments")).content.decode()
    assert "chat-8b" not in page


def test_detail_shows_status_endpoint_snippets_and_audit(signed_in, member, deployment, settings):
    settings.TANDEM_GATEWAY_BASE_URL = "https://gw.example.com/v1"
    page = signed_in(member).get(detail(deployment)).content.decode()
    assert 'id="status-panel"' in page and 'hx-trigger="every 5s"' in page  # waiting for a human: slower polling
    assert 'base_url="https://gw.example.com/v1"' in page and 'model="llama-3-8b"' in page  # Python
    assert "curl https://gw.example.com/v1/chat/completions" in page  # curl
    assert 'baseURL: "https://gw.example.com/v1"' in page  # JavaScript
    assert "Audit trail" in page and "<code>requested</code>" in page
    assert 'data-url="/api/v1/deployments/%d/latency/"' % deployment.pk in page
    assert 'data-url="/api/v1/usage/?deployment=%d"' % deployment.pk in page
    assert 'data-url="/api/v1/deployments/%d/conformance/"' % deployment.pk in page
    assert "vendor/chartjs/chart.umd.min.js" in page


def test_other_teams_pages_are_404(signed_in, outsider, deployment, htmx_headers):
    client = signed_in(outsider)
    assert client.get(detail(deployment)).status_code == 404
    assert client.get(status_url(deployment), headers=htmx_headers()).status_code == 404
    assert client.get(reverse("frontend:deployment-edit", args=[deployment.pk])).status_code == 404
    assert client.get(reverse("frontend:deployment-delete", args=[deployment.pk])).status_code == 404
    for action in ("approve", "reject", "withdraw", "retry", "delete"):
        assert client.post(reverse(f"frontend:deployment-{action}", args=[deployment.pk])).status_code == 404
    deployment.refresh_from_db()
    assert deployment.status == Status.PENDING_APPROVAL


def test_status_panel_polls_while_in_flight_and_answers_286_once_settled(signed_in, member, deployment, team_admin,
                                                                         htmx_headers):
    client = signed_in(member)
    deployment_transition(deployment=deployment, to=Status.APPROVED, actor=team_admin, event_kind="approved")
    deployment_transition(deployment=deployment, to=Status.PROVISIONING)
    response = client.get(status_url(deployment), headers=htmx_headers("status-panel"))
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert 'hx-trigger="every 2s"' in body and "Provisioning" in body and "Approved" in body
    assert 'id="head-actions" hx-swap-oob="true"' in body  # the header's actions follow the status

    deployment_transition(deployment=deployment, to=Status.RUNNING, reason="Endpoint answering.")
    response = client.get(status_url(deployment), headers=htmx_headers("status-panel"))
    body = response.content.decode()
    assert response.status_code == 286  # htmx stops polling, and still swaps in the final panel
    assert 'data-status="running"' in body and "hx-trigger" not in body.split("head-actions")[0]


def test_status_panel_without_htmx_goes_to_the_page(signed_in, member, deployment):
    response = signed_in(member).get(status_url(deployment))
    assert response.status_code == 302 and response["Location"] == detail(deployment)


def test_settled_detail_page_does_not_poll(signed_in, member, deployment):
    deployment_transition(deployment=deployment, to=Status.WITHDRAWN, actor=member)
    page = signed_in(member).get(detail(deployment)).content.decode()
    assert "hx-trigger" not in page.split('id="status-panel"')[1].split(">")[0]


def test_member_cannot_approve(signed_in, member, deployment):
    response = signed_in(member).post(reverse("frontend:deployment-approve", args=[deployment.pk]),
                                      {"comment": "self"}, follow=True)
    deployment.refresh_from_db()
    assert deployment.status == Status.PENDING_APPROVAL
    assert "Only admins of team ml-research" in response.content.decode()


def test_admin_approves_with_comment_and_requester_sees_it(signed_in, team_admin, member, deployment):
    response = signed_in(team_admin).post(reverse("frontend:deployment-approve", args=[deployment.pk]),
                                          {"comment": "Go ahead, keep it under 8 GPUs.", "generation": "1",
                                           "next": reverse("frontend:approvals")})
    assert response.status_code == 302 and response["Location"] == reverse("frontend:approvals")
    deployment.refresh_from_db()
    assert deployment.status == Status.APPROVED
    page = signed_in(member).get(detail(deployment)).content.decode()
    assert "Go ahead, keep it under 8 GPUs." in page


def test_reject_with_comment(signed_in, team_admin, deployment):
    signed_in(team_admin).post(reverse("frontend:deployment-reject", args=[deployment.pk]),
                               {"comment": "Too big.", "generation": "1"})
    deployment.refresh_from_db()
    assert deployment.status == Status.REJECTED and deployment.status_reason == "Too big."


def test_withdraw_and_retry(signed_in, member, team_admin, deployment):
    client = signed_in(member)
    deployment_transition(deployment=deployment, to=Status.APPROVED, actor=team_admin)
    deployment_transition(deployment=deployment, to=Status.FAILED, reason="Node group failed.")
    page = client.get(detail(deployment)).content.decode()
    assert "Retry</button>" in page and "Node group failed." in page
    client.post(reverse("frontend:deployment-retry", args=[deployment.pk]))
    deployment.refresh_from_db()
    assert deployment.status == Status.APPROVED


def test_delete_needs_the_name_typed(signed_in, member, team_admin, deployment):
    client = signed_in(member)
    deployment_transition(deployment=deployment, to=Status.APPROVED, actor=team_admin)
    url = reverse("frontend:deployment-delete", args=[deployment.pk])
    assert "Type <code>chat-8b</code> to confirm" in client.get(url).content.decode()
    response = client.post(url, {"confirm_name": "wrong"})
    assert response.status_code == 400
    deployment.refresh_from_db()
    assert deployment.status == Status.APPROVED
    assert client.post(url, {"confirm_name": "chat-8b"}).status_code == 302
    deployment.refresh_from_db()
    assert deployment.status == Status.DELETING


def test_a_service_refusal_is_shown_not_a_500(signed_in, member, deployment):
    response = signed_in(member).post(reverse("frontend:deployment-retry", args=[deployment.pk]), follow=True)
    assert response.status_code == 200
    assert "Only a failed deployment can be retried" in response.content.decode()


def test_detail_shows_the_plan_what_nixl_moved_and_that_the_endpoint_is_being_checked(
        signed_in, member, team, tmp_path):
    """A local model: the plan reads its config.json; the last conformance run's NIXL bytes sit beside it."""
    import json

    from django.utils import timezone

    from deployments.conditions import condition_set
    from deployments.spec import spec_parse
    from observability.models import ConformanceRun
    from tests.factories import ClusterFactory, local_spec_input

    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 64, "intermediate_size": 192, "vocab_size": 1024, "torch_dtype": "bfloat16"}))
    spec = local_spec_input(model={"id": "tiny-llama", "source": str(tmp_path)},
                            expected_load={"requests_per_second": 1, "mean_prompt_tokens": 260,
                                           "mean_output_tokens": 32})
    cluster = ClusterFactory(kind="ray", config={"dashboard_url": "http://127.0.0.1:8265",
                                                 "model_sources": {"paths": [str(tmp_path)]}})
    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="tiny", status=Status.RUNNING,
                          spec=spec_parse(spec, target_kind="ray").to_dict())
    d.conditions = condition_set([], type="EndpointReady", status=False, reason="ConformancePending",
                                 message="Serve answers; Tandem is checking.", generation=d.generation,
                                 now=timezone.now())
    d.save()
    ConformanceRun.objects.create(deployment=d, started_at=timezone.now(), base_url="http://gw/v1", model="tiny-llama",
                                  pd_health={"nixl_transfers": 3, "nixl_bytes_range": [98304, 393216]})
    page = signed_in(member).get(detail(d)).content.decode()
    assert 'class="badge wait plain" title="Serve answers; Tandem is checking.">checking</span>' in page
    assert "before your keys are let in" in page
    plan_card = page.split('data-plan-panel')[1].split("</section>")[0]
    # 260 prompt tokens → 3 blocks of the CPU engine's 128 tokens × 1,024 B.
    assert "3 blocks of 128 (the engine&#x27;s block size) = 384 tokens × 1,024 B = 393,216 B." in plan_card
    assert "NIXL in the last conformance run: 3 transfers, 98,304–393,216 bytes in all" in plan_card


def test_the_status_panel_says_in_full_why_it_does_not_serve(signed_in, member, team, cluster, htmx_headers):
    """The conditions' cards show the start of a message; what the cluster reports wrong is listed whole, a stage's
    cause on a line, on the page and in the panel htmx polls."""
    from django.utils.html import escape

    from deployments.services.status import deployment_observe

    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="stuck", status=Status.PROVISIONING)
    why = ["prefill: OOMKilled: container ray-worker was killed for running out of memory (exit code 137) before it "
           "was ever ready; its memory limit is 345Gi. It needs more memory than the pool's nodes give it.",
           "decode: CrashLoopBackOff: container ray-worker keeps crashing, restarted 4 times (last exit: Error 1); its "
           "last log lines: RuntimeError: CUDA error: no kernel image is available"]
    deployment_observe(deployment_id=d.pk, condition_updates={"ServeRunning": {
        "status": False, "reason": "OOMKilled", "message": "\n".join(why), "generation": d.generation}})
    client = signed_in(member)
    for page in (client.get(detail(d)).content.decode(),
                 client.get(status_url(d), headers=htmx_headers("status-panel")).content.decode()):
        block = page[page.index("Why it does not serve"):]
        assert [f"<li>{escape(line)}</li>" in block for line in why] == [True, True]
