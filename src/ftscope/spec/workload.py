"""What is trained on: batch shape, sequence lengths (fixed or from a dataset's statistics), epochs."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Literal

from ..errors import FtscopeError
from .schema import Int, Number, forbid_extra, validate

DEFAULT_NUM_SAMPLES = 10_000
"""Samples per epoch when neither num_samples nor a dataset says."""
MAX_SEQ = 4_194_304  # beyond any model's context: a larger number is a typo
Tokens = Number(gt=0, le=MAX_SEQ)


@forbid_extra
@dataclass(frozen=True)
class DatasetStats:
    """Token-length statistics of a training set (prompt + answer, after the chat template)."""

    num_samples: Int(1, 10**12)
    mean_tokens: Tokens
    """Mean tokens per sample."""
    max_tokens: Int(1, MAX_SEQ)
    """Longest sample, tokens."""
    median_tokens: Tokens | None = None
    p95_tokens: Tokens | None = None
    p99_tokens: Tokens | None = None

    def _lognormal(self) -> tuple[float, float]:
        """(mu, sigma) of a log-normal matching the median and mean: lengths are right-skewed."""
        median = self.median_tokens or self.mean_tokens
        mu = math.log(max(median, 1.0))
        ratio = max(self.mean_tokens / max(median, 1.0), 1.0)
        sigma = math.sqrt(2 * math.log(ratio)) if ratio > 1 else 0.0
        if self.p99_tokens and self.p99_tokens > median:  # the tail decides padding: prefer fitting p99
            sigma = max(sigma, math.log(self.p99_tokens / median) / 2.326)
        return mu, sigma

    def expected_longest(self, batch: int, cutoff: int | None = None) -> float:
        """Expected length of the longest of `batch` random samples (what dynamic padding pads to)."""
        cap = min(self.max_tokens, cutoff) if cutoff else self.max_tokens
        if batch <= 1:
            return min(self.mean_tokens, cap)
        # the max of n draws is never expected below one draw's mean, which bounds very skewed data
        return min(max(_expected_max(self, batch, cap), self.mean_tokens), cap)

    def log_quantile_knots(self) -> tuple[tuple[tuple[float, float], ...], float, float]:
        """The length distribution as knots (z, log tokens) at the stated quantiles (median, p95, p99; z the
        standard-normal score), log-linear in z between them, and the slopes below the first and above the
        last: a log-normal piece per interval, so a p95 or p99 the single log-normal misses is still met."""
        median = self.median_tokens or self.mean_tokens
        knots = [(0.0, math.log(max(median, 1.0)))]
        for z, value in ((Z95, self.p95_tokens), (Z99, self.p99_tokens)):
            if value and math.log(value) > knots[-1][1]:
                knots.append((z, math.log(value)))
        if len(knots) == 1:  # only the median and the mean: the log-normal they give
            sigma = self._lognormal()[1]
            return tuple(knots), sigma, sigma
        slope = [(y1 - y0) / (z1 - z0) for (z0, y0), (z1, y1) in zip(knots, knots[1:])]
        return tuple(knots), slope[0], slope[-1]

    def mean_truncated(self, cutoff: int | None) -> float:
        """Mean tokens per sample after truncation at `cutoff`."""
        if not cutoff or cutoff >= self.max_tokens:
            return self.mean_tokens
        mu, sigma = self._lognormal()
        if not sigma:
            return min(self.mean_tokens, cutoff)
        # E[min(X, c)] for log-normal X
        c = math.log(cutoff)
        z1 = (c - mu - sigma**2) / sigma
        z2 = (c - mu) / sigma
        trunc = math.exp(mu + sigma**2 / 2) * _norm_cdf(z1) + cutoff * (1 - _norm_cdf(z2))
        return min(self.mean_tokens, trunc)


Z95, Z99 = 1.6448536269514722, 2.3263478740408408
"""Standard-normal scores of the 95th and 99th percentiles."""
EXPECTED_MAX_NODES = 96
"""Midpoint nodes of the expected-maximum integral (within 0.2 % of a 20,000-node sum on the bundled datasets)."""


_NODE_LOGS = tuple(math.log((i + 0.5) / EXPECTED_MAX_NODES) for i in range(EXPECTED_MAX_NODES))
"""log v of each midpoint node v of _expected_max's integral: the same for every batch."""


@lru_cache(maxsize=4096)
def _node_scores(batch: int) -> tuple[float, ...]:
    """The standard-normal score of each midpoint node v ** (1 / batch) of _expected_max's integral: the same for
    every dataset and cutoff (a process that plans several datasets, or several cutoffs, meets a batch again)."""
    expm1, ppf = math.expm1, _norm_ppf
    return tuple([-ppf(-expm1(log_v / batch)) for log_v in _NODE_LOGS])  # 1 - v ** (1 / n), kept exact near 1


@lru_cache(maxsize=4096)
def _expected_max(stats: DatasetStats, batch: int, cap: float) -> float:
    """E[min(max of `batch` draws, cap)] = integral over v in (0, 1) of Q(v ** (1 / batch)), Q the quantile
    function of stats' lengths: the max of n draws has CDF F ** n, so v = F ** n is uniform."""
    knots, below, above = stats.log_quantile_knots()
    (first_z, first_y), (last_z, last_y) = knots[0], knots[-1]
    # _log_length_at's pieces, their differences taken once: (z1, y0, y1 - y0, z0, z1 - z0)
    pieces = [(z1, y0, y1 - y0, z0, z1 - z0) for (z0, y0), (z1, y1) in zip(knots, knots[1:])]
    exp = math.exp
    total = 0.0
    for z in _node_scores(batch):  # a plan asks for every new micro-batch: 96 nodes, kept lean
        if z <= first_z:  # _log_length_at(z, knots, below, above), inline
            y = first_y + below * (z - first_z)
        else:
            for z1, y0, dy, z0, dz in pieces:
                if z <= z1:
                    y = y0 + dy * (z - z0) / dz
                    break
            else:
                y = last_y + above * (z - last_z)
        length = exp(y)
        total += cap if cap < length else length  # min(length, cap)
    return total / EXPECTED_MAX_NODES


def _log_length_at(z: float, knots: tuple[tuple[float, float], ...], below: float, above: float) -> float:
    """log tokens at standard-normal score z: log-linear between the knots, the end slopes beyond them (written
    out; _expected_max runs the same operations inline)."""
    if z <= knots[0][0]:
        return knots[0][1] + below * (z - knots[0][0])
    for (z0, y0), (z1, y1) in zip(knots, knots[1:]):
        if z <= z1:
            return y0 + (y1 - y0) * (z - z0) / (z1 - z0)
    return knots[-1][1] + above * (z - knots[-1][0])


def _norm_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _norm_ppf(p: float) -> float:
    # Acklam's rational approximation; scipy would cost its import time on the estimate path. The coefficients
    # stand in the expressions (a plan evaluates it 96 times per new micro-batch).
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return ((((((-7.784894002430293e-03 * q + -3.223964580411365e-01) * q + -2.400758277161838e00) * q
                   + -2.549732539343734e00) * q + 4.374664141464968e00) * q + 2.938163982698783e00)
                / ((((7.784695709041462e-03 * q + 3.224671290700398e-01) * q + 2.445134137142996e00) * q
                    + 3.754408661907416e00) * q + 1))
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return ((((((-3.969683028665376e01 * r + 2.209460984245205e02) * r + -2.759285104469687e02) * r
               + 1.383577518672690e02) * r + -3.066479806614716e01) * r + 2.506628277459239e00) * q
            / (((((-5.447609879822406e01 * r + 1.615858368580409e02) * r + -1.556989798598866e02) * r
                 + 6.680131188771972e01) * r + -1.328068155288572e01) * r + 1))


@forbid_extra
@dataclass(frozen=True)
class Workload:
    """Batch shape and data. Field names are the scenario's `workload:` keys."""

    micro_batch_size: Int(1, 65536) | Literal["max"] = 1
    """Samples per GPU per forward; "max" solves for the largest that fits."""
    seq_len: Int(1, MAX_SEQ) | None = None
    """Tokens per sequence: fixed length (max_length / packed) or the truncation cutoff for a dataset."""
    dataset: DatasetStats | None = None
    """Token-length statistics of the training set (tokens), instead of a fixed seq_len or with it as the cutoff."""
    padding: Literal["dynamic", "max_length", "packed"] = "dynamic"
    """dynamic (pad to the longest in the batch) | max_length (pad to seq_len) | packed (concatenate to seq_len)."""
    gradient_accumulation: Int(1, 100_000) = 1
    """Micro-batches per optimizer step."""
    epochs: Number(gt=0, le=10_000) = 1.0
    """Passes over the data (fractions allowed)."""
    num_samples: Int(1, 10**12) | None = None
    """Samples per epoch when no dataset is given (null: 10,000)."""

    @property
    def solve_batch(self) -> bool:
        return self.micro_batch_size == "max"

    def peak_seq_len(self) -> int:
        """The sequence length memory must hold: the longest batch the run will see."""
        if self.padding in ("max_length", "packed") or self.dataset is None:
            return int(self.seq_len or (self.dataset.max_tokens if self.dataset else 512))
        return int(min(self.dataset.max_tokens, self.seq_len) if self.seq_len else self.dataset.max_tokens)

    def mean_tokens_per_sample(self) -> float:
        """Non-padding tokens per sample."""
        if self.dataset is None:
            return float(self.peak_seq_len())
        return self.dataset.mean_truncated(self.seq_len)

    def mean_padded_len(self, batch: int) -> float:
        """Average padded sequence length the GPU computes on at this micro-batch."""
        if self.padding in ("max_length", "packed") or self.dataset is None:
            return float(self.peak_seq_len())
        key = (self.dataset, self.seq_len, batch)  # all it reads: workloads differing elsewhere share the value
        hit = _PADDED.get(key)
        if hit is None:
            if len(_PADDED) >= 65_536:
                _PADDED.clear()
            hit = _PADDED[key] = max(self.dataset.expected_longest(batch, self.seq_len), self.mean_tokens_per_sample())
        return hit

    def samples_per_epoch(self) -> int:
        if self.dataset is not None:
            return self.dataset.num_samples
        return int(self.num_samples or DEFAULT_NUM_SAMPLES)

    def samples_per_sequence(self) -> float:
        """Samples per packed sequence (1 unless packed)."""
        if self.padding != "packed" or self.dataset is None:
            return 1.0
        return max(self.peak_seq_len() / max(self.mean_tokens_per_sample(), 1.0), 1.0)


_PADDED: dict[tuple, float] = {}
"""mean_padded_len by (dataset, seq_len, batch): a search asks for it once per mix otherwise (each solved workload
is its own object), and the expected longest of a batch integrates the length distribution."""


def check_workload(w: Workload) -> Workload:
    """The workload with each key checked against its field type, then the rules across keys."""
    raw = {f.name: getattr(w, f.name) for f in fields(Workload)}
    if isinstance(w.dataset, DatasetStats):
        raw["dataset"] = {f.name: getattr(w.dataset, f.name) for f in fields(DatasetStats)}
    w = validate(Workload, raw, "workload")
    if w.dataset is None and w.seq_len is None:
        raise FtscopeError("workload needs seq_len or a dataset with token-length statistics")
    if w.padding == "packed" and w.seq_len is None:
        raise FtscopeError("workload.padding: packed needs workload.seq_len (the packed length)")
    d = w.dataset
    if d is not None:
        for name in ("mean_tokens", "median_tokens", "p95_tokens", "p99_tokens"):
            value = getattr(d, name)
            if value is not None and value > d.max_tokens:
                raise FtscopeError(f"workload.dataset.{name} ({value:g}) exceeds max_tokens ({d.max_tokens})")
    return w
