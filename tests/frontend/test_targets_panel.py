"""Targets in the portal: the request form takes them and the plan judges them; the deployment page shows
attainment and the diagnosis, switches window with htmx, and applies a recommendation with one click."""
import pytest
from django.utils import timezone

from deployments.models import Deployment
from frontend import spec_form
from tests.frontend.test_request_form import NEW, VALIDATE, form_data
from tests.observability.test_attainment import _deployment, _queue_growing, _records

pytestmark = pytest.mark.django_db


def test_the_form_takes_targets_and_the_plan_judges_them(signed_in, member, cluster):
    client = signed_in(member)
    targets = {"targets_ttft_p95_ms": "40", "targets_itl_p95_ms": "20"}
    facts = {"fact_num_hidden_layers": "32", "fact_hidden_size": "4096", "fact_num_attention_heads": "32",
             "fact_num_key_value_heads": "8", "fact_head_dim": "128", "fact_param_count": "8030261248"}
    plan = client.post(VALIDATE, form_data(cluster, **targets, **facts)).content.decode()
    # g6e.12xlarge (L40S, TP 4): the H200 profile scaled, the range and the profile's source shown (the figures are
    # observability.planner_targets' on these facts, which give no vocabulary; the arithmetic is in the plan).
    assert "Targets: misses" in plan and "TTFT p95: expected 67.1 ms (66.1–69.0 ms) against 40 ms" in plan
    assert "Performance profile: L40S, scaled, not measured: H200 profile scaled" in plan
    client.post(NEW, form_data(cluster, **targets))
    d = Deployment.objects.get(name="chat-8b")
    assert d.spec["targets"] == {"ttft_p95_ms": 40.0, "itl_p95_ms": 20.0, "share": 0.95}
    assert spec_form.values_from_spec(d.spec_typed)["targets_ttft_p95_ms"] == "40"
    client.post(NEW, form_data(cluster, name="no-targets"))
    assert "targets" not in Deployment.objects.get(name="no-targets").spec


def test_the_page_shows_attainment_and_diagnosis_and_applies_the_recommendation(signed_in, member, team,
                                                                                 htmx_headers):
    now = timezone.now()
    d = _deployment(team, requested_by=member)
    _records(d, now, [100, 900, 900, 900])
    _queue_growing(d, now)
    client = signed_in(member)
    page = client.get(f"/deployments/{d.pk}/").content.decode()
    assert 'data-measure="ttft"' in page and "25% (1 of 4)" in page and "missed" in page
    assert 'data-diagnosis="prefill_short"' in page and "prefill is short of replicas" in page
    assert "Recommendation: <strong>prefill replicas 1–2 → 2</strong>, +0 GPUs, +$0.00/h" in page
    # Its weights are on S3: no config.json facts, so the expected TTFT is unavailable and the page says why.
    assert ("expected TTFT: unavailable, because its weights are on S3 (s3://models/llama-3-8b), and Tandem reads a "
            "model&#x27;s config.json only from a local path") in page
    fragment = client.get(f"/deployments/{d.pk}/targets/?targets_window=15m",
                          headers=htmx_headers("targets-panel")).content.decode()
    assert "<html" not in fragment and "Last 15m: 4 answered requests" in fragment
    rec_id = page.split('data-recommendation="')[1].split('"')[0]
    response = client.post(f"/deployments/{d.pk}/recommendations/{rec_id}/apply/")
    assert response.status_code == 302
    d.refresh_from_db()
    assert d.status == "updating" and d.spec["prefill"]["replicas_min"] == 2
    assert "Update applied" in client.get(f"/deployments/{d.pk}/").content.decode()


def test_a_deployment_without_targets_says_how_to_set_them(signed_in, member, deployment):
    page = signed_in(member).get(f"/deployments/{deployment.pk}/").content.decode()
    assert "No latency targets" in page


def test_team_admins_let_tandem_apply_recommendations_and_members_cannot(signed_in, team, team_admin, member):
    signed_in(member).post("/team/auto-apply/", {"auto_apply_recommendations": "on"})
    team.refresh_from_db()
    assert team.auto_apply_recommendations is False
    admin = signed_in(team_admin)
    assert "Let Tandem apply the advisor" in admin.get("/team/").content.decode()
    admin.post("/team/auto-apply/", {"auto_apply_recommendations": "on"})
    team.refresh_from_db()
    assert team.auto_apply_recommendations is True
    admin.post("/team/", {"credential_default_days": "30", "credential_max_days": "90"})  # the lifetimes form
    team.refresh_from_db()
    assert (team.credential_default_days, team.auto_apply_recommendations) == (30, True)


def test_the_plan_panel_shows_the_fleet_correction_and_its_source(signed_in, member, team, cluster):
    """A running Llama-3.1-8B on H200s recorded an hour of 300 requests 8% faster in prefill than the profile
    (tests/observability/test_fleet_calibration.py's recording): the request form's plan says so and uses it."""
    from tests.observability.test_fleet_calibration import _hour, _record, _running

    _record(_running(team), _hour(1), requests=300, prefill_ratio=0.92, decode_ratio=1.0)
    h200 = {f"{stage}_{k}": v for stage in ("prefill", "decode") for k, v in
            {"instance_type": "p5e.48xlarge", "gpus_per_node": "8", "tensor_parallel_size": "1"}.items()}
    facts = {"fact_num_hidden_layers": "32", "fact_hidden_size": "4096", "fact_num_attention_heads": "32",
             "fact_num_key_value_heads": "8", "fact_head_dim": "128", "fact_param_count": "8030261248",
             "fact_vocab_size": "128256"}
    load = {"load_requests_per_second": "0.1", "load_mean_prompt_tokens": "2048", "load_mean_output_tokens": "256"}
    plan = signed_in(member).post(VALIDATE, form_data(cluster, **h200, **facts, **load)).content.decode()
    assert f"Measured on deployment {team.slug}/chat-8b over 300 requests: prefill 0.92× the profile." in plan
    assert "prefill 51.6 ms (50.8–53.4 ms)" in plan and "H200, measured: h200-20261204-llama8b-qwen32b.json" in plan
