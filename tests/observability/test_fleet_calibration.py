"""Self-calibration from the fleet: a running deployment's recorded rollups correct plans of the same model on the
same GPU, through the plan API.

The recorded figures are those of a Llama-3.1-8B deployment on H200s (p5e.48xlarge, TP 1) that runs 8% faster in
prefill and 10% slower in decode than the H200 profile predicts; they go in through the writers the scraper and the
gateway use (rollup_increase, gateway_rollup from RequestRecord rows), at 2,048 prompt and 256 output tokens.
"""
import datetime as dt

import pytest
from django.utils import timezone

from deployments.spec import spec_parse
from observability.fleet_calibration import MIN_REQUESTS
from observability.histograms import Hist
from observability.model_facts import model_facts_parse
from observability.performance_model import decode_step_seconds, prefill_seconds
from observability.rollups import gateway_rollup, rollup_increase
from observability.snapshot import Increase
from tests.factories import DeploymentFactory, TeamFactory, spec_input
from tests.observability.test_planner import LLAMA_8B
from tests.observability.test_planner_targets import LOAD_2K, P5E
from usage.models import RequestRecord

pytestmark = pytest.mark.django_db
FACTS = model_facts_parse(LLAMA_8B)
PREFILL_MS = prefill_seconds(FACTS, "H200", 2048) * 1000  # 56.04
STEP_MS = decode_step_seconds(FACTS, "H200", 8, 2048 + 128) * 1000  # 8 running, prompt + half the output


def _running(team, name="chat-8b"):
    spec = spec_parse(spec_input(prefill=P5E, decode=P5E, expected_load=LOAD_2K))
    return DeploymentFactory(team=team, name=name, status="running", spec=spec.to_dict())


def _hour(hours_ago: int) -> dt.datetime:
    return timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=hours_ago)


def _record(d, start: dt.datetime, *, requests: int, prefill_ratio: float, decode_ratio: float):
    """One hour of traffic: the gateway's request rows, and the engines' increases from a scrape every 10 minutes."""
    RequestRecord.objects.bulk_create(RequestRecord(
        request_id=f"{d.pk}-{start:%H}-{i}", deployment=d, created_at=start + dt.timedelta(seconds=10 * i % 3600),
        endpoint="chat.completions", stream=True, status_code=200, prompt_tokens=2048, completion_tokens=256,
        ttft_ms=80, e2e_ms=2000, mean_itl_ms=8) for i in range(requests))
    gateway_rollup(since=start, until=start + dt.timedelta(hours=1))
    per_scrape = requests // 6 or 1
    for m in range(0, 60, 10):
        inc = Increase()
        inc.hist[("prefill", "prefill")] = Hist.from_values([PREFILL_MS * prefill_ratio] * per_scrape, [25, 50, 100])
        inc.hist[("itl", "decode")] = Hist.from_values([STEP_MS * decode_ratio] * per_scrape * 255, [5, 10, 20])
        inc.gauge[("running", "decode")] = 8
        rollup_increase(deployment_id=d.pk, minute=start + dt.timedelta(minutes=m), inc=inc)


def _plan(api, user):
    api.force_authenticate(user)
    r = api.post("/api/v1/plans/", {"spec": spec_input(prefill=P5E, decode=P5E, expected_load=LOAD_2K),
                                    "model_facts": LLAMA_8B}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def test_the_correction_changes_a_plan_after_recorded_traffic_and_not_before(team, member, api):
    d = _running(team)
    before = _plan(api, member)
    assert before["latency"]["fleet"] == [] and before["latency"]["prefill_ms"]["expected_ms"] == 56.0
    _record(d, _hour(1), requests=MIN_REQUESTS, prefill_ratio=0.92, decode_ratio=1.10)
    after = _plan(api, member)
    lat = after["latency"]
    assert lat["prefill_ms"]["expected_ms"] == round(PREFILL_MS * 0.92, 1)
    assert lat["itl_ms"]["expected_ms"] > before["latency"]["itl_ms"]["expected_ms"] * 1.05
    assert {(f["stage"], f["deployment"], f["requests"], f["ratio"]) for f in lat["fleet"]} == {
        ("prefill", f"{team.slug}/chat-8b", MIN_REQUESTS, 0.92), ("decode", f"{team.slug}/chat-8b", MIN_REQUESTS, 1.1)}
    assert any(line.startswith(f"Latency, fleet: measured on deployment {team.slug}/chat-8b over {MIN_REQUESTS} "
                               "requests") and ": prefill 0.92× the profile" in line for line in after["arithmetic"])


def test_too_little_traffic_gives_no_correction(team, member, api):
    _record(_running(team), _hour(1), requests=MIN_REQUESTS - 1, prefill_ratio=0.5, decode_ratio=2.0)
    lat = _plan(api, member)["latency"]
    assert lat["fleet"] == [] and lat["prefill_ms"]["expected_ms"] == 56.0


def test_a_drifting_correction_follows_the_latest_window(team, member, api):
    d = _running(team)
    _record(d, _hour(3), requests=MIN_REQUESTS, prefill_ratio=1.10, decode_ratio=1.0)
    _record(d, _hour(2), requests=MIN_REQUESTS, prefill_ratio=0.92, decode_ratio=1.0)
    _record(d, _hour(1), requests=MIN_REQUESTS - 1, prefill_ratio=1.50, decode_ratio=1.0)  # too little to count
    [prefill] = [f for f in _plan(api, member)["latency"]["fleet"] if f["stage"] == "prefill"]
    assert prefill["ratio"] == 0.92 and prefill["window_end"] == _hour(1).isoformat()


def test_another_teams_deployment_corrects_the_plan_without_being_named(member, api):
    _record(_running(TeamFactory(slug="other-team"), name="secret-name"), _hour(1), requests=MIN_REQUESTS,
            prefill_ratio=0.92, decode_ratio=1.0)
    plan = _plan(api, member)
    assert {f["deployment"] for f in plan["latency"]["fleet"]} == {"of another team"}
    assert "secret-name" not in str(plan)
