"""The sign test the PD end-to-end test judges the gateway's added TTFT by (tests/e2e/test_local_pd.py).

No per-pair samples of the local PD stack are recorded anywhere (the suite printed medians only), so the inputs
are built from what is: direct streaming TTFT of 0.14-0.23 s on this machine kind (FACTS.md), the gateway adding
a few ms (bench/README.md), and stalls of a loaded 2-core machine that hit one sample of a pair."""
import math

import pytest

from tests.support.paired import paired_ratio_below

# Twenty direct TTFTs across FACTS.md's range, in the order a run might see them.
DIRECT = [0.140, 0.152, 0.231, 0.167, 0.145, 0.198, 0.220, 0.176, 0.143, 0.160,
          0.205, 0.188, 0.149, 0.226, 0.171, 0.158, 0.212, 0.183, 0.147, 0.194]


def test_p_values_are_the_binomial_tail():
    """15 of 20 below: P(Bin(20, 1/2) >= 15) = 21700 / 2^20; 14 of 20 is not enough at 95 %."""
    assert paired_ratio_below([1.0] * 20, [1.0] * 15 + [2.0] * 5, bound=1.5).p_value == 21700 / 2 ** 20
    fourteen = paired_ratio_below([1.0] * 20, [1.0] * 14 + [2.0] * 6, bound=1.5)
    assert (fourteen.below, fourteen.pairs) == (14, 20)
    assert math.isclose(fourteen.p_value, 60460 / 2 ** 20) and fourteen.p_value > 0.05
    assert paired_ratio_below([1.0] * 20, [1.0] * 20, bound=1.5).p_value == 1 / 2 ** 20


def test_a_gateway_adding_a_few_ms_passes_though_stalls_hit_some_of_its_samples():
    gateway = [d + 0.003 for d in DIRECT]
    for i in (2, 7, 11, 16):  # a descheduled gateway (or client) during four of the pairs
        gateway[i] += 0.150
    result = paired_ratio_below(DIRECT, gateway, bound=1.25)
    assert (result.below, result.p_value <= 0.05) == (16, True)


def test_load_that_slows_both_paths_alike_changes_nothing():
    """The machine gets three times slower halfway through: medians of each path move by 100 ms and more, the
    ratios of pairs measured back to back do not."""
    slowed = [d * (3 if i >= 10 else 1) for i, d in enumerate(DIRECT)]
    result = paired_ratio_below(slowed, [d * 1.02 for d in slowed], bound=1.25)
    assert (result.below, result.p_value) == (20, 1 / 2 ** 20)


def test_a_gateway_adding_a_quarter_or_more_fails():
    """60 ms more on every request (a gateway that held the first chunk back until the next one came) is
    26-43 % of these TTFTs: no pair is below the bound."""
    result = paired_ratio_below(DIRECT, [d + 0.060 for d in DIRECT], bound=1.25)
    assert (result.below, result.p_value) == (0, 1.0)


def test_a_coin_flip_is_not_evidence():
    """Half the pairs above the bound: the gateway is as likely as not to add a quarter; p is far above 0.05."""
    gateway = [d * (1.1 if i % 2 else 1.4) for i, d in enumerate(DIRECT)]
    assert paired_ratio_below(DIRECT, gateway, bound=1.25).p_value > 0.5


def test_a_pair_without_a_first_token_counts_against():
    gateway = [d + 0.003 for d in DIRECT]
    gateway[0] = math.nan  # no content chunk came back (bench.local_pd_latency records NaN)
    assert paired_ratio_below(DIRECT, gateway, bound=1.25).below == 19


def test_pairs_must_match():
    with pytest.raises(ValueError):
        paired_ratio_below(DIRECT, DIRECT[:-1], bound=1.25)
    with pytest.raises(ValueError):
        paired_ratio_below([], [], bound=1.25)
