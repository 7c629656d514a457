"""Workload: dataset length statistics (dynamic padding, truncation), peak sequence length, checks."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftscope import FtscopeError
from ftscope.spec import workload as W
from ftscope.spec.workload import DatasetStats, Workload, check_workload

ALPACA = DatasetStats(num_samples=52002, mean_tokens=270, median_tokens=230, p99_tokens=900, max_tokens=2048)
MATH = DatasetStats(num_samples=15000, mean_tokens=187, median_tokens=174, p99_tokens=411, max_tokens=1470)


@st.composite
def datasets(draw, max_skew: float = 2.0):
    """Right-skewed length statistics, as chat/instruction datasets have (mean up to `max_skew` x median)."""
    median = draw(st.floats(8, 4000))
    mean = median * draw(st.floats(1.0, max_skew))
    p99 = draw(st.one_of(st.none(), st.floats(mean, mean * 6)))
    max_tokens = int(math.ceil(max(mean, p99 or 0) * draw(st.floats(1.0, 4.0)))) + 1
    return DatasetStats(num_samples=draw(st.integers(1, 10**6)), mean_tokens=mean, median_tokens=median,
                        p99_tokens=p99, max_tokens=max_tokens)


# ---- expected longest (what dynamic padding pads to) --------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(datasets(), st.integers(2, 512), st.one_of(st.none(), st.integers(16, 32768)))
def test_expected_longest_grows_with_batch_and_stays_under_max_and_cutoff(d, batch, cutoff):
    here, bigger = d.expected_longest(batch, cutoff), d.expected_longest(batch + 1, cutoff)
    assert here <= bigger + 1e-9
    assert bigger <= d.max_tokens
    if cutoff:
        assert bigger <= cutoff


@settings(max_examples=150, deadline=None)
@given(datasets(max_skew=1.5), st.one_of(st.none(), st.integers(16, 32768)))
def test_longest_of_two_is_at_least_one_sample_for_moderate_skew(d, cutoff):
    assert d.expected_longest(2, cutoff) >= d.expected_longest(1, cutoff) - 1e-9


def test_longest_of_two_is_at_least_one_sample_for_heavy_tails():
    d = DatasetStats(num_samples=1000, mean_tokens=1000, median_tokens=100, max_tokens=5000)
    assert d.expected_longest(2) >= d.expected_longest(1)


def test_expected_longest_of_one_sample_is_the_mean():
    assert ALPACA.expected_longest(1) == 270
    assert ALPACA.expected_longest(1, cutoff=128) == 128


def test_expected_longest_approaches_the_tail_for_large_batches():
    assert MATH.expected_longest(64) > MATH.p99_tokens * 0.8
    assert MATH.p99_tokens < MATH.expected_longest(10**6) <= MATH.max_tokens


def test_expected_longest_matches_sampled_batches_of_a_two_mode_dataset():
    """Short answers plus a long-prompt tail (p95 far above a single log-normal's): the expected longest follows
    batches drawn from the real lengths at every batch size, from the body (2) to the tail (32)."""
    import numpy as np
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.lognormal(math.log(70), 0.45, 9000),
                              rng.lognormal(math.log(290), 0.15, 1000)]).round().clip(1, 512)
    d = DatasetStats(num_samples=lengths.size, mean_tokens=float(lengths.mean()),
                     median_tokens=float(np.median(lengths)), p95_tokens=float(np.quantile(lengths, 0.95)),
                     p99_tokens=float(np.quantile(lengths, 0.99)), max_tokens=int(lengths.max()))
    for batch in (2, 4, 8, 16, 32):
        sampled = rng.choice(lengths, size=(20000, batch)).max(axis=1).mean()
        assert d.expected_longest(batch) == pytest.approx(sampled, rel=0.07)


@settings(max_examples=60, deadline=None)
@given(datasets(max_skew=3.0), st.integers(1, 70_000), st.sampled_from([None, 64, 512]))
def test_the_expected_maximum_is_its_integral_node_by_node(d, batch, cutoff):
    """_expected_max (its loop inlined for speed, its nodes' scores kept per batch: _node_scores) equals the 96-node
    midpoint sum written out with _log_length_at and _norm_ppf, ==: a plan reads it for every new micro-batch."""
    cap = min(d.max_tokens, cutoff) if cutoff else d.max_tokens
    knots, below, above = d.log_quantile_knots()
    nodes = W.EXPECTED_MAX_NODES
    want = 0.0
    for i in range(nodes):
        z = -W._norm_ppf(-math.expm1(math.log((i + 0.5) / nodes) / batch))
        want += min(math.exp(W._log_length_at(z, knots, below, above)), cap)
    assert W._expected_max.__wrapped__(d, batch, cap) == want / nodes


def test_the_inverse_normal_is_acklams_to_its_accuracy():
    from statistics import NormalDist
    for p in (1e-12, 1e-4, 0.02, 0.02425, 0.1, 0.5, 0.8, 0.97575, 0.99, 1 - 1e-9):
        want = NormalDist().inv_cdf(p)
        assert abs(W._norm_ppf(p) - want) <= 1.2e-9 * max(1.0, abs(want))


def test_constant_length_dataset_has_no_padding():
    d = DatasetStats(num_samples=100, mean_tokens=512, median_tokens=512, max_tokens=512)
    assert d.expected_longest(64) == 512


# ---- truncation --------------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(datasets(), st.integers(1, 65536))
def test_mean_truncated_is_at_most_the_mean_and_the_cutoff(d, cutoff):
    m = d.mean_truncated(cutoff)
    assert 0 < m <= d.mean_tokens
    assert m <= cutoff * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(datasets(), st.integers(1, 4096), st.integers(1, 4096))
def test_mean_truncated_grows_with_the_cutoff(d, a, b):
    lo, hi = sorted((a, b))
    assert d.mean_truncated(lo) <= d.mean_truncated(hi) + 1e-9


def test_cutoff_at_or_above_max_keeps_the_mean():
    assert ALPACA.mean_truncated(None) == ALPACA.mean_truncated(2048) == ALPACA.mean_truncated(10**6) == 270


# ---- peak sequence length -------------------------------------------------------------------------------

@pytest.mark.parametrize("seq_len, expected", [(None, 2048), (1024, 1024), (4096, 2048)])
def test_dynamic_padding_peak_is_the_longest_sample_capped_by_seq_len(seq_len, expected):
    assert Workload(seq_len=seq_len, dataset=ALPACA, padding="dynamic").peak_seq_len() == expected


@pytest.mark.parametrize("padding", ["max_length", "packed"])
def test_fixed_length_padding_peak_is_seq_len(padding):
    assert Workload(seq_len=4096, dataset=ALPACA, padding=padding).peak_seq_len() == 4096


def test_packed_sequences_hold_several_samples():
    w = Workload(seq_len=2048, dataset=ALPACA, padding="packed")
    assert w.samples_per_sequence() == pytest.approx(2048 / ALPACA.mean_tokens)
    assert Workload(seq_len=2048, dataset=ALPACA).samples_per_sequence() == 1.0


def test_mean_padded_len_is_between_the_mean_and_the_peak():
    w = Workload(seq_len=1024, dataset=ALPACA)
    for batch in (1, 4, 32):
        assert w.mean_tokens_per_sample() <= w.mean_padded_len(batch) <= w.peak_seq_len()


def test_samples_per_epoch_comes_from_the_dataset_or_num_samples():
    assert Workload(seq_len=512, dataset=ALPACA).samples_per_epoch() == 52002
    assert Workload(seq_len=512, num_samples=123).samples_per_epoch() == 123


# ---- checks -------------------------------------------------------------------------------------------------

def test_packed_needs_seq_len():
    with pytest.raises(FtscopeError, match="packed needs workload.seq_len"):
        check_workload(Workload(dataset=ALPACA, padding="packed"))


def test_needs_seq_len_or_a_dataset():
    with pytest.raises(FtscopeError, match="needs seq_len or a dataset"):
        check_workload(Workload())


@pytest.mark.parametrize("changes, message", [
    ({"micro_batch_size": 0}, "micro_batch_size must be"),
    ({"micro_batch_size": -4}, "micro_batch_size must be"),
    ({"micro_batch_size": "auto"}, "micro_batch_size must be"),
    ({"seq_len": 0}, "seq_len must be"),
    ({"seq_len": 10**9}, "seq_len must be"),
    ({"padding": "left"}, "padding must be one of"),
    ({"gradient_accumulation": 0}, "gradient_accumulation must be"),
    ({"epochs": -1}, "epochs must be a finite number above 0"),
    ({"epochs": 0}, "epochs must be a finite number above 0"),
    ({"epochs": float("nan")}, "epochs must be a finite number above 0"),
    ({"num_samples": 0}, "num_samples must be an integer from 1"),
])
def test_out_of_range_values_are_rejected(changes, message):
    base = {"micro_batch_size": 1, "seq_len": 512}
    with pytest.raises(FtscopeError, match=message):
        check_workload(Workload(**{**base, **changes}))


@pytest.mark.parametrize("stats, message", [
    (dict(num_samples=10, mean_tokens=600, max_tokens=500), "mean_tokens .* exceeds max_tokens"),
    (dict(num_samples=10, mean_tokens=100, median_tokens=600, max_tokens=500), "median_tokens .* exceeds"),
    (dict(num_samples=0, mean_tokens=100, max_tokens=500), "num_samples must be an integer from 1"),
    (dict(num_samples=10, mean_tokens=float("nan"), max_tokens=500), "mean_tokens must be a finite number above 0"),
    (dict(num_samples=10, mean_tokens=100, max_tokens=500, p99_tokens=-1), "p99_tokens must be a finite number above 0"),
])
def test_inconsistent_dataset_statistics_are_rejected(stats, message):
    with pytest.raises(FtscopeError, match=message):
        check_workload(Workload(micro_batch_size=1, dataset=DatasetStats(**stats)))


def test_max_micro_batch_is_a_valid_request():
    w = Workload(micro_batch_size="max", seq_len=512)
    check_workload(w)
    assert w.solve_batch
