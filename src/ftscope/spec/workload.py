"""What is trained on: batch shape, sequence lengths (fixed or from a dataset's statistics), epochs."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FtscopeError

PADDING = ("dynamic", "max_length", "packed")
MAX_SEQ = 4_194_304  # beyond any model's context: a larger number is a typo


@dataclass(frozen=True)
class DatasetStats:
    """Token-length statistics of a training set (prompt + answer, after the chat template)."""

    num_samples: int
    mean_tokens: float
    max_tokens: int
    median_tokens: float | None = None
    p95_tokens: float | None = None
    p99_tokens: float | None = None

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
        mu, sigma = self._lognormal()
        if not sigma:
            return min(self.mean_tokens, cap)
        # Blom's plotting position: the largest of n draws sits near quantile (n - 0.375) / (n + 0.25);
        # the max of n draws is never expected below one draw's mean, which bounds very skewed data
        z = _norm_ppf((batch - 0.375) / (batch + 0.25))
        return min(max(math.exp(mu + sigma * z), self.mean_tokens), cap)

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


def _norm_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _norm_ppf(p: float) -> float:
    # Acklam's rational approximation; scipy would cost its import time on the estimate path.
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


@dataclass(frozen=True)
class Workload:
    """Batch shape and data. Field names are the scenario's `workload:` keys."""

    micro_batch_size: int | str = 1
    """Samples per GPU per forward; "max" solves for the largest that fits."""
    seq_len: int | None = None
    """Fixed length (max_length / packed) or the truncation cutoff for a dataset."""
    dataset: DatasetStats | None = None
    padding: str = "dynamic"
    """dynamic (pad to the longest in the batch) | max_length (pad to seq_len) | packed (concatenate to seq_len)."""
    gradient_accumulation: int = 1
    epochs: float = 1.0
    num_samples: int | None = None
    """Samples per epoch when no dataset is given."""

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
        return max(self.dataset.expected_longest(batch, self.seq_len), self.mean_tokens_per_sample())

    def samples_per_epoch(self) -> int:
        if self.dataset is not None:
            return self.dataset.num_samples
        return int(self.num_samples or 10_000)

    def samples_per_sequence(self) -> float:
        """Samples per packed sequence (1 unless packed)."""
        if self.padding != "packed" or self.dataset is None:
            return 1.0
        return max(self.peak_seq_len() / max(self.mean_tokens_per_sample(), 1.0), 1.0)


def check_workload(w: Workload) -> None:
    mbs = w.micro_batch_size
    if mbs != "max" and (isinstance(mbs, bool) or not isinstance(mbs, int) or not 1 <= mbs <= 65536):
        raise FtscopeError(f"workload.micro_batch_size must be an integer from 1 to 65536 or \"max\"; got {mbs!r}")
    if w.seq_len is not None and (isinstance(w.seq_len, bool) or not isinstance(w.seq_len, int)
                                  or not 1 <= w.seq_len <= MAX_SEQ):
        raise FtscopeError(f"workload.seq_len must be an integer from 1 to {MAX_SEQ}; got {w.seq_len!r}")
    if w.padding not in PADDING:
        raise FtscopeError(f"workload.padding must be one of {', '.join(PADDING)}; got {w.padding!r}")
    if w.dataset is None and w.seq_len is None:
        raise FtscopeError("workload needs seq_len or a dataset with token-length statistics")
    if w.padding == "packed" and w.seq_len is None:
        raise FtscopeError("workload.padding: packed needs workload.seq_len (the packed length)")
    ga = w.gradient_accumulation
    if isinstance(ga, bool) or not isinstance(ga, int) or not 1 <= ga <= 100_000:
        raise FtscopeError(f"workload.gradient_accumulation must be an integer from 1 to 100000; got {ga!r}")
    if isinstance(w.epochs, bool) or not isinstance(w.epochs, (int, float)) or not 0 < w.epochs <= 10_000 or w.epochs != w.epochs:
        raise FtscopeError(f"workload.epochs must be a number above 0; got {w.epochs!r}")
    if w.num_samples is not None and (not isinstance(w.num_samples, int) or isinstance(w.num_samples, bool) or w.num_samples < 1):
        raise FtscopeError(f"workload.num_samples must be a positive integer; got {w.num_samples!r}")
    d = w.dataset
    if d is not None:
        for name in ("num_samples", "mean_tokens", "max_tokens", "median_tokens", "p95_tokens", "p99_tokens"):
            v = getattr(d, name)
            if v is None and name not in ("num_samples", "mean_tokens", "max_tokens"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not 0 < v <= MAX_SEQ * (10**6 if name == "num_samples" else 1):
                raise FtscopeError(f"workload.dataset.{name} must be a positive number; got {v!r}")
        if d.mean_tokens > d.max_tokens:
            raise FtscopeError(f"workload.dataset.mean_tokens ({d.mean_tokens}) exceeds max_tokens ({d.max_tokens})")
        if d.median_tokens is not None and d.median_tokens > d.max_tokens:
            raise FtscopeError(f"workload.dataset.median_tokens ({d.median_tokens}) exceeds max_tokens ({d.max_tokens})")
