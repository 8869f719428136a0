"""Histogram arithmetic: merge bucket counts and read percentiles exact to the bucket (as histogram_quantile)."""
import bisect
import math
from dataclasses import dataclass, field


@dataclass
class Hist:
    """Non-cumulative counts per upper bound (math.inf for +Inf), with the observations' sum and count."""

    buckets: dict[float, int] = field(default_factory=dict)
    sum: float = 0.0
    count: int = 0

    def add(self, other: "Hist") -> "Hist":
        for bound, n in other.buckets.items():
            self.buckets[bound] = self.buckets.get(bound, 0) + n
        self.sum += other.sum
        self.count += other.count
        return self

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket holding the q-th observation, like Prometheus's
        histogram_quantile; the +Inf bucket answers with the highest finite bound."""
        total = sum(self.buckets.values())
        if total <= 0:
            return None
        rank, seen, lower = q * total, 0, 0.0
        for bound in sorted(self.buckets):
            n = self.buckets[bound]
            if n and seen + n >= rank:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * ((rank - seen) / n)
            seen += n
            if not math.isinf(bound):
                lower = bound
        return lower

    def bounds_range(self) -> tuple[float, float]:
        """What the observations sum to, as far as the buckets tell: (lowest, highest) possible sum. Ray exports a
        histogram's `_sum` as bucket midpoints (its OpenTelemetry recorder re-records each count at its bucket's
        midpoint), so for Ray's series this range, not `sum`, is what is known; +Inf makes the top unbounded."""
        lo = hi = 0.0
        lower = 0.0
        for bound in sorted(self.buckets):
            n = self.buckets[bound]
            if n:
                lo += n * lower
                hi += n * bound
            if not math.isinf(bound):
                lower = bound
        return lo, hi

    def to_json(self) -> dict:
        bounds = sorted(b for b in self.buckets if not math.isinf(b))
        return {"bounds": bounds, "counts": [self.buckets[b] for b in bounds] + [self.buckets.get(math.inf, 0)],
                "sum": self.sum, "count": self.count}

    @classmethod
    def from_json(cls, data: dict) -> "Hist":
        bounds = [*data["bounds"], math.inf]
        # Empty buckets are kept: they are the lower bounds of the next ones.
        return cls(dict(zip(bounds, data["counts"], strict=True)), data["sum"], data["count"])

    @classmethod
    def from_values(cls, values, bounds) -> "Hist":
        """Bucket raw observations (e.g. the gateway's per-request timings) into fixed upper bounds."""
        ordered = sorted(bounds)
        h = cls({b: 0 for b in [*ordered, math.inf]})
        for v in values:
            i = bisect.bisect_left(ordered, v)
            b = ordered[i] if i < len(ordered) else math.inf
            h.buckets[b] = h.buckets.get(b, 0) + 1
            h.sum += v
            h.count += 1
        return h
