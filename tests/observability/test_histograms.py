"""Percentiles from bucket counts, as histogram_quantile reads them."""
import math

from observability.histograms import Hist


def test_quantile_interpolates_inside_the_bucket():
    h = Hist({10.0: 50, 20.0: 40, 50.0: 10}, sum=1000, count=100)
    assert h.quantile(0.5) == 10.0
    assert h.quantile(0.7) == 15.0  # 20 of the 40 in (10, 20]
    assert h.quantile(0.95) == 35.0  # 5 of the 10 in (20, 50]


def test_inf_bucket_answers_the_highest_finite_bound_and_empty_is_none():
    assert Hist({10.0: 1, math.inf: 9}, count=10).quantile(0.99) == 10.0
    assert Hist().quantile(0.5) is None


def test_json_round_trip_and_merge():
    a = Hist.from_values([1, 3, 7, 400], [2, 5, 10])
    assert a.to_json() == {"bounds": [2, 5, 10], "counts": [1, 1, 1, 1], "sum": 411, "count": 4}
    b = Hist.from_json(a.to_json()).add(Hist.from_values([4], [2, 5, 10]))
    assert b.buckets == {2: 1, 5: 2, 10: 1, math.inf: 1} and b.count == 5


def test_bounds_range_is_what_the_buckets_know_of_the_sum():
    """Ray exports `_sum` as bucket midpoints; the buckets bound the true sum. Empty buckets still give the next
    one its lower bound, and an observation in +Inf leaves the top open."""
    h = Hist({32768.0: 0, 131072.0: 1, 524288.0: 2, math.inf: 0}, sum=81920 + 2 * 327680, count=3)
    assert h.bounds_range() == (32768 + 2 * 131072, 131072 + 2 * 524288)
    assert Hist({10.0: 1, math.inf: 1}, count=2).bounds_range() == (10.0, math.inf)
