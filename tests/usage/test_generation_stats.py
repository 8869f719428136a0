"""generation_stats: what one generation of a deployment served over a window, from the gateway's request records
in PostgreSQL, as the rollout's judge compares them."""
import datetime as dt
import itertools

import pytest
from django.utils import timezone

from deployments.spec import TargetsSpec
from tests.factories import DeploymentFactory
from usage.models import RequestRecord
from usage.selectors import GenerationStats, generation_stats

pytestmark = pytest.mark.django_db


_ids = itertools.count()


def _record(deployment, generation, at, **fields):
    values = {"endpoint": "chat.completions", "stream": True, "status_code": 200, "ttft_ms": 100.0, "e2e_ms": 900.0,
              "mean_itl_ms": 20.0, **fields}
    return RequestRecord(request_id=f"r{next(_ids)}", deployment=deployment, generation=generation, created_at=at, **values)


@pytest.fixture
def served(team):
    """Generation 4's records in the window, and records that must not count: generation 5's, another
    deployment's generation 4, and generation 4's before and after the window."""
    now = timezone.now()
    d, other = DeploymentFactory(team=team), DeploymentFactory(team=team)
    at = now - dt.timedelta(minutes=5)
    RequestRecord.objects.bulk_create([
        *(_record(d, 4, at, ttft_ms=t, mean_itl_ms=itl) for t, itl in ((100, 20), (200, 20), (300, 20), (400, 60),
                                                                     (500, 20))),
        _record(d, 4, at, stream=False, ttft_ms=None, mean_itl_ms=None),  # answered, not streamed: no TTFT
        _record(d, 4, at, stream=False, status_code=502, ttft_ms=None, error_type="upstream_error"),
        _record(d, 4, at, partial=True, error_type="upstream_disconnected", ttft_ms=5),  # upstream cut it
        _record(d, 4, at, status_code=499, partial=True, error_type="client_disconnected", ttft_ms=5),  # client left
        _record(d, 4, at, status_code=400, ttft_ms=None, error_type="invalid_value"),  # the client's mistake
        _record(d, 5, at, status_code=503, ttft_ms=9000),
        _record(other, 4, at, status_code=500, ttft_ms=9000),
        _record(d, 4, now - dt.timedelta(hours=2), status_code=500, ttft_ms=9000),
        _record(d, 4, now + dt.timedelta(minutes=1), status_code=500, ttft_ms=9000),
    ])
    return d, now - dt.timedelta(hours=1), now


def test_counts_failures_and_streamed_ttft_of_one_generation_in_the_window(served, django_assert_num_queries):
    d, since, until = served
    with django_assert_num_queries(1):
        stats = generation_stats(deployment_id=d.pk, generation=4, since=since, until=until)
    # 10 requests; failed: the 502 and the stream upstream cut short, not the client that left nor the 400.
    assert stats == GenerationStats(requests=10, failed=2, ttft_p50_ms=300.0, ttft_p95_ms=pytest.approx(480.0),
                                    attained=None)
    assert stats.error_rate == 0.2


def test_attained_is_the_lowest_share_meeting_a_target_by_the_attainment_rule(served, django_assert_num_queries):
    """Answered requests only (status below 400, not cut short: 6 here). TTFT at most 350 ms: 3 of the 5 streamed
    ones measured; mean ITL at most 50 ms: 4 of 5. The lower share is the generation's."""
    d, since, until = served
    with django_assert_num_queries(2):
        stats = generation_stats(deployment_id=d.pk, generation=4, since=since, until=until,
                                 targets=TargetsSpec(ttft_p95_ms=350, itl_p95_ms=50))
    assert stats.attained == pytest.approx(0.6)
    only_itl = generation_stats(deployment_id=d.pk, generation=4, since=since, until=until,
                                targets=TargetsSpec(itl_p95_ms=50))
    assert only_itl.attained == pytest.approx(0.8)


def test_a_generation_without_requests_has_nothing_to_judge(served):
    d, since, until = served
    assert generation_stats(deployment_id=d.pk, generation=6, since=since, targets=TargetsSpec(ttft_p95_ms=1)) == \
        GenerationStats(requests=0, failed=0, ttft_p50_ms=None, ttft_p95_ms=None, attained=None)
    assert generation_stats(deployment_id=d.pk, generation=6, since=since).error_rate is None
