"""A paired, relative comparison of two paths measured back to back on one machine, with a stated confidence.

Medians of each path and an absolute margin fail by load: a busy machine slows both paths, and a few descheduled
samples move a median of ten. Pairs measured back to back see the same load; their ratio cancels it, and a sign
test counts only on which side of the bound each pair falls, so one pair hit by a stall weighs one pair."""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SignTest:
    """Of `pairs` ratios, `below` were under the bound; `p_value` is the chance of that many or more if the
    median ratio were at the bound (one-sided sign test), so `p_value <= alpha` shows, with confidence
    1 - alpha, that the median ratio is below it."""

    below: int
    pairs: int
    p_value: float


def paired_ratio_below(baseline: list[float], candidate: list[float], *, bound: float) -> SignTest:
    """One-sided sign test of "median(candidate[i] / baseline[i]) < bound" against "it is at least `bound`".
    A pair with a missing figure (NaN) or a ratio at the bound counts against the claim."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError(f"pairs needed: {len(baseline)} baseline and {len(candidate)} candidate figures")
    pairs = len(baseline)
    below = sum(1 for b, c in zip(baseline, candidate) if b > 0 and c / b < bound)
    p_value = sum(math.comb(pairs, k) for k in range(below, pairs + 1)) / 2 ** pairs
    return SignTest(below=below, pairs=pairs, p_value=p_value)
