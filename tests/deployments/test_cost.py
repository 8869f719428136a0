"""What a deployment costs, from its timeline: node-hours per pool and day, prices, and the time a resume takes."""
import datetime as dt

import pytest

from deployments.cost import (ON_DEMAND, Mark, Prices, cost_per_million, daily_rows, provisioned_segments,
                              ready_estimate_seconds, spec_hourly_usd, timeline_marks)
from deployments.spec import spec_parse
from tests.factories import spec_input

T0 = dt.datetime(2026, 11, 30, 22, 0, tzinfo=dt.UTC)


def at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def spec(prefill_nodes=1, decode_nodes=2, itype="g6e.12xlarge") -> dict:
    pool = {"instance_type": itype, "gpus_per_node": 4, "tensor_parallel_size": 4}
    return spec_parse(spec_input(prefill={**pool, "nodes": prefill_nodes},
                                 decode={**pool, "nodes": decode_nodes})).to_dict()


def test_only_billed_hours_count_and_a_day_boundary_splits_them():
    """Requested and approved cost nothing; provisioning to pausing costs every node; paused costs nothing."""
    marks = [Mark(at(0), "pending_approval", spec()), Mark(at(1), "approved"), Mark(at(1), "provisioning"),
             Mark(at(1.5), "running"), Mark(at(3), "pausing"), Mark(at(3.25), "paused"), Mark(at(10), "provisioning"),
             Mark(at(10.5), "running")]
    rows = daily_rows(provisioned_segments(marks, until=at(11)), since=at(0), until=at(11), prices=ON_DEMAND)
    price = ON_DEMAND.node_hour_usd("g6e.12xlarge")
    # 23:00 → 00:00 on the 30th, 00:00 → 01:15 and 08:00 → 09:00 on the 1st; prefill 1 node, decode 2.
    assert [(r["date"].isoformat(), r["stage"], round(r["node_hours"], 4)) for r in rows] == [
        ("2026-11-30", "prefill", 1.0), ("2026-11-30", "decode", 2.0),
        ("2026-12-01", "prefill", 2.25), ("2026-12-01", "decode", 4.5)]
    assert sum(r["usd"] for r in rows) == pytest.approx(9.75 * price)


def test_an_approved_update_changes_the_nodes_from_its_moment():
    marks = [Mark(at(0), "running", spec(1, 1)), Mark(at(1), None, spec(1, 3)), Mark(at(1), "updating"),
             Mark(at(1.5), "running")]
    segments = provisioned_segments(marks, until=at(2))
    assert sum(s.node_hours for s in segments if s.stage == "decode") == pytest.approx(1 * 1 + 3 * 1)


def test_a_clusters_own_price_overrides_the_on_demand_price():
    marks = [Mark(at(0), "running", spec(1, 1, "p5.48xlarge"))]
    reserved = Prices(own={"p5.48xlarge": 30.0})
    rows = daily_rows(provisioned_segments(marks, until=at(1)), since=at(0), until=at(1), prices=reserved)
    assert sum(r["usd"] for r in rows) == pytest.approx(60.0)
    typed = spec_parse(spec_input(prefill={"instance_type": "p5.48xlarge", "nodes": 1, "gpus_per_node": 8,
                                           "tensor_parallel_size": 8}))  # and g6e.12xlarge's decode, not reserved
    assert spec_hourly_usd(typed, prices=reserved) == pytest.approx(30.0 + 10.493)
    assert spec_hourly_usd(typed, prices=ON_DEMAND) == pytest.approx(55.04 + 10.493)


def test_timeline_marks_read_status_and_spec_from_event_rows_and_skip_the_rest():
    rows = [{"created_at": at(2), "after": {"status": "running", "reason": "Serving."}},
            {"created_at": at(0), "after": {"name": "x", "spec": spec()}},
            {"created_at": at(1), "after": {"message": "a worker step"}}, {"created_at": at(3), "after": None}]
    marks = timeline_marks(rows)
    assert [(m.status, m.spec is not None) for m in marks] == [(None, True), ("running", False)]


def test_the_ready_estimate_is_the_median_of_its_own_starts_and_a_default_without_history():
    marks = [Mark(at(0), "approved"), Mark(at(0.1), "provisioning"), Mark(at(0.1) + dt.timedelta(seconds=600), "running"),
             Mark(at(1), "pausing"), Mark(at(1.1), "paused"),
             Mark(at(2), "provisioning"), Mark(at(2) + dt.timedelta(seconds=100), "running"),
             Mark(at(3), "pausing"), Mark(at(3.1), "paused"),
             Mark(at(4), "provisioning"), Mark(at(4) + dt.timedelta(seconds=140), "running")]
    assert ready_estimate_seconds(marks) == 140  # median of 960 (approval → running), 100 and 140
    assert ready_estimate_seconds([], default=77) == 77


def test_cost_per_million_output_tokens():
    assert cost_per_million(2.0, 500_000) == pytest.approx(4.0)
    assert cost_per_million(2.0, 0) is None
