"""The advisor's expected figures on stored data, through the advice API: the model's facts come from the weights'
config.json inside the model sources the cluster allows the team (nothing else is read), the traffic from the
gateway's rollups, the correction from the deployment's own earlier hour; where the facts cannot be read the
figure is unavailable and the reason says why.

The recorded situation is a Llama-3.1-8B deployment on H200s (p5e.48xlarge, TP 1, decode 2–3 replicas) whose decode
is full: 48 sequences running at peak, KV cache at 95%, ITL 30 ms against a 20 ms target. An hour two hours earlier
it served 300 requests with decode steps 10% slower than the H200 profile predicts at its batch; it all goes in
through the writers the scraper and the gateway use (rollup_increase, gateway_rollup from RequestRecord rows).
"""
import datetime as dt
import json

import pytest
from django.utils import timezone

from deployments.spec import spec_parse
from observability.histograms import Hist
from observability.model_facts import model_facts_parse
from observability.performance_model import decode_step_seconds, expected_range, profile_for
from observability.rollups import gateway_rollup, rollup_increase
from observability.snapshot import Increase
from tests.factories import ClusterFactory, DeploymentFactory, spec_input
from tests.observability.test_planner import LLAMA_8B
from usage.models import RequestRecord

pytestmark = pytest.mark.django_db
FACTS = model_facts_parse(LLAMA_8B)
CONTEXT = 2048 + 128  # the mean prompt and half the mean output
P5E = {"instance_type": "p5e.48xlarge", "nodes": 1, "gpus_per_node": 8, "tensor_parallel_size": 1}


def _deployment(team, *, source: str, model_sources: dict):
    cluster = ClusterFactory(kind="ray", config={"model_sources": model_sources})
    spec = spec_parse(spec_input(model={"id": "llama-3-8b", "source": source},
                                 prefill={**P5E, "replicas_min": 1, "replicas_max": 1},
                                 decode={**P5E, "replicas_min": 2, "replicas_max": 3},
                                 targets={"itl_p95_ms": 20}))
    return DeploymentFactory(team=team, cluster=cluster, name="chat-8b", status="running", spec=spec.to_dict())


def _requests(d, times, *, itl_ms: float):
    RequestRecord.objects.bulk_create(RequestRecord(
        request_id=f"{d.pk}-{t.isoformat()}-{i}", deployment=d, created_at=t, endpoint="chat.completions",
        stream=True, status_code=200, prompt_tokens=2048, completion_tokens=256, ttft_ms=80, e2e_ms=2000,
        mean_itl_ms=itl_ms) for i, t in enumerate(times))


def _record_situation(d, now: dt.datetime) -> float:
    """The earlier hour and the window; returns the decode ratio the earlier hour measured."""
    start = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    _requests(d, [start + dt.timedelta(seconds=12 * i) for i in range(300)], itl_ms=8)
    gateway_rollup(since=start, until=start + dt.timedelta(hours=1))
    step_ms = decode_step_seconds(FACTS, "H200", 8, CONTEXT) * 1000  # 24 running over 3 replicas
    for m in range(0, 60, 10):
        inc = Increase()
        inc.hist[("itl", "decode")] = Hist.from_values([step_ms * 1.10] * 50 * 255, [5, 10, 20])
        inc.gauge[("running", "decode")] = 24
        rollup_increase(deployment_id=d.pk, minute=start + dt.timedelta(minutes=m), inc=inc)
    _requests(d, [now - dt.timedelta(minutes=20)] * 40, itl_ms=30)
    gateway_rollup(since=now - dt.timedelta(hours=1), until=now + dt.timedelta(minutes=1))
    full = Increase()
    full.gauge[("running", "decode")] = 48
    full.gauge[("kv_cache_usage", "decode")] = 0.95
    rollup_increase(deployment_id=d.pk, minute=now - dt.timedelta(minutes=30), inc=full)
    return 1.10


def _recommendation(api, user, d) -> dict:
    api.force_authenticate(user)
    body = api.get(f"/api/v1/deployments/{d.pk}/attainment/?window=1h").json()
    [diag] = body["diagnoses"]
    assert diag["kind"] == "decode_short", diag
    return diag["recommendation"]


def test_a_full_decode_expects_the_models_step_with_its_range_and_the_deployments_own_correction(
        team, member, api, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    d = _deployment(team, source=str(tmp_path), model_sources={"paths": [str(tmp_path)]})
    ratio = _record_situation(d, timezone.now())
    rec = _recommendation(api, member, d)
    assert rec["summary"] == "decode replicas 2–3 → 3"
    # 48 running at peak over 3 replicas: 16 sequences of 2,176 tokens each, 10% slower than the profile.
    expected = decode_step_seconds(FACTS, "H200", 16, CONTEXT) * ratio * 1000
    low, high = (b * 1000 for b in expected_range(expected / 1000, profile_for("H200").decode_error))
    p = rec["prediction"]
    assert p["expected_ms"] == pytest.approx(expected, abs=0.05) and p["meets"] is True and p["target_ms"] == 20
    assert p["range_ms"] == [pytest.approx(low, abs=0.05), pytest.approx(high, abs=0.05)]
    assert p["profile"]["kind"] == "measured"
    assert (p["fleet"]["deployment"], p["fleet"]["requests"], p["fleet"]["ratio"]) == (
        f"{team.slug}/chat-8b", 300, pytest.approx(ratio, abs=0.001))
    assert (f"= 16.0 sequences per replica of 2,176 tokens (mean prompt + half the output, the window's 40 requests) "
            f"at TP 1: {expected:,.2f} ms (range {low:,.2f} ms–{high:,.2f} ms), under the 20.0 ms target (H200, "
            f"measured profile, × 1.10 as measured on deployment {team.slug}/chat-8b over 300 requests") \
        in rec["expected"]


@pytest.mark.parametrize("where", ["s3", "outside_the_roots", "not_a_decoder_config"])
def test_facts_that_cannot_be_read_give_an_unavailable_figure_that_says_why(team, member, api, tmp_path, where):
    config = {"architectures": ["CLIPModel"]} if where == "not_a_decoder_config" else LLAMA_8B
    (tmp_path / "config.json").write_text(json.dumps(config))
    if where == "not_a_decoder_config":
        d = _deployment(team, source=str(tmp_path), model_sources={"paths": [str(tmp_path)]})
        why = (f"{tmp_path}/config.json does not give the facts the performance model needs (model_facts.num_layers: "
               "A positive whole number is required (one of num_layers, num_hidden_layers).)")
    elif where == "s3":
        d = _deployment(team, source="s3://models/llama-3-8b", model_sources={"s3": ["s3://models"]})
        why = ("its weights are on S3 (s3://models/llama-3-8b), and Tandem reads a model's config.json only from a "
               "local path, so the performance model has no facts for this model")
    else:  # a config.json is there, but the cluster does not let the team load from that directory
        d = _deployment(team, source=str(tmp_path), model_sources={"paths": ["/models/shared"]})
        why = (f"no config.json can be read in {tmp_path} inside the model sources the cluster allows the team, so "
               "the performance model has no facts for this model")
    _record_situation(d, timezone.now())
    rec = _recommendation(api, member, d)
    assert rec["summary"] == "decode replicas 2–3 → 3"  # the recommendation stands on the evidence
    assert rec["prediction"] == {"unavailable": why}
    assert rec["expected"] == f"expected ITL: unavailable, because {why}"
