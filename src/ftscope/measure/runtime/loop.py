"""The timed step loop every real measurement runs, and the typed point it produces.

`Stepper` times one optimizer step (forward, backward, optimizer; synchronized on CUDA) over one or more
micro-batches; the distributed engines (measure/distributed/engines.py) are Steppers too. `timed_steps` runs it
N times and sums what it saw; `ProfilePoint` is what one batch size measured (`RankPoint`: one rank of a
distributed run). `profile`, the distributed worker and the MoE study all go through here, and the results
store holds these points and hands them back typed (`batch_points`).

torch is imported inside the functions that need it: importing this module does not import torch.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Sequence

from ...errors import FtscopeError, install_hint
from ...spec.scenario import Scenario

if TYPE_CHECKING:
    from ..store import Store
    from .batches import BatchShape

StepTimes = tuple[float, float, float]
"""Seconds of one step's forward, backward and optimizer parts."""


def resolve_device(device: str) -> str:
    """auto | cpu | cuda[:N] -> the device to run on (one-line errors when it is not there)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FtscopeError("--device cuda but torch sees no CUDA device (use --device cpu)")
    if device != "cpu" and not device.startswith("cuda"):
        raise FtscopeError(f"--device must be auto, cuda or cpu; got {device!r}")
    return device


def make_optimizer(model: Any, scn: Scenario) -> Any:
    """The mix's optimizer over the model's trainable parameters (AdamW, SGD, bitsandbytes 8-bit AdamW)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    name = scn.mix.optimizer
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise FtscopeError(f"optimizer {name} needs bitsandbytes: {install_hint('measure')}") from None
    cls = bnb.optim.PagedAdamW8bit if name == "paged_adamw_8bit" else bnb.optim.AdamW8bit
    return cls(params, lr=1e-4)


def autocast(device: str, dtype: Any) -> ContextManager[Any]:
    """torch.autocast on the device's type at `dtype` (a torch dtype or its name); a no-op for None."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=dtype)


class Stepper:
    """One synchronized optimizer step over its micro-batches, split into forward, backward and optimizer time.

    The base class trains a plain module; the distributed engines override the hooks below (DDP's no_sync,
    DeepSpeed's own backward and step). `mark(phase)` is called after each phase, outside the timed parts.
    """

    name = "single"

    def __init__(self, model: Any, optimizer: Any, device: str, autocast_dtype: Any) -> None:
        import torch

        self.torch = torch
        self.model, self.opt, self.device = model, optimizer, device
        self.autocast = getattr(torch, autocast_dtype) if isinstance(autocast_dtype, str) else autocast_dtype
        self.steps_done = 0
        """Optimizer steps taken so far."""

    def __call__(self, batch: dict[str, Any]) -> StepTimes:
        return self.step([batch])

    def step(self, batches: Sequence[dict[str, Any]], mark: Callable[[str], None] | None = None) -> StepTimes:
        """One optimizer step over the micro-batches (gradient accumulation): summed forward, backward and
        optimizer seconds."""
        mark = mark or (lambda _phase: None)
        fwd = bwd = opt = 0.0
        n = len(batches)
        for i, batch in enumerate(batches):
            with self._accumulating(last=i == n - 1):
                self._sync()
                t0 = time.perf_counter()
                loss = self._scale(self._forward(batch), n)
                self._sync()
                fwd += time.perf_counter() - t0
                mark("forward")
                t0 = time.perf_counter()
                self._backward(loss)
                self._sync()
                bwd += time.perf_counter() - t0
                mark("backward")
            opt += self._micro_step()
        opt += self._optimizer_step()
        mark("optimizer")
        self.steps_done += 1
        return fwd, bwd, opt

    # -- what engines override --------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _accumulating(self, last: bool) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def _forward(self, batch: dict[str, Any]) -> Any:
        with autocast(self.device, self.autocast):
            return self.model(**batch).loss

    def _scale(self, loss: Any, micro_batches: int) -> Any:
        return loss / micro_batches if micro_batches > 1 else loss

    def _backward(self, loss: Any) -> None:
        loss.backward()

    def _micro_step(self) -> float:
        """Optimizer seconds spent after each micro-batch (DeepSpeed steps at every one)."""
        return 0.0

    def _optimizer_step(self) -> float:
        t0 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t0


@dataclass
class StepTotals:
    """Sums over timed steps."""

    steps: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    tokens: int = 0
    """Non-padding tokens."""
    samples: int = 0
    padded_len: float = 0.0
    """Sum over steps of the mean padded length of the step's micro-batches."""
    wall_s: float = 0.0
    """Wall time of the whole loop, batch creation included."""

    @property
    def compute_s(self) -> float:
        """Forward + backward + optimizer."""
        return self.forward_s + self.backward_s + self.optimizer_s

    def add(self, times: StepTimes, shapes: Sequence[BatchShape]) -> None:
        f, b, o = times
        self.steps += 1
        self.forward_s, self.backward_s, self.optimizer_s = self.forward_s + f, self.backward_s + b, self.optimizer_s + o
        self.tokens += sum(sh.tokens for sh in shapes)
        self.samples += sum(len(sh.lengths) for sh in shapes)
        self.padded_len += sum(sh.padded_len for sh in shapes) / len(shapes)

    def point_fields(self) -> dict[str, Any]:
        """Per-step means and rates, as ProfilePoint fields."""
        n, total = self.steps, self.compute_s
        return {"steps": n, "step_s": total / n, "wall_step_s": self.wall_s / n, "forward_s": self.forward_s / n,
                "backward_s": self.backward_s / n, "optimizer_s": self.optimizer_s / n,
                "tokens_per_s": self.tokens / total, "samples_per_s": self.samples / total,
                "padded_len_mean": self.padded_len / n}


def timed_steps(step: Callable[[Any], tuple[StepTimes, Sequence[BatchShape]]], inputs: Iterable[Any],
                totals: StepTotals | None = None) -> StepTotals:
    """Run `step(x)` for each input (it returns the step's times and the shapes of its micro-batches) and sum
    them into `totals` (a new one by default); the wall time of the loop is added too."""
    totals = totals if totals is not None else StepTotals()
    wall0 = time.perf_counter()
    for x in inputs:
        times, shapes = step(x)
        totals.add(times, shapes)
    totals.wall_s += time.perf_counter() - wall0
    return totals


def error_text(exc: BaseException, limit: int = 600) -> str:
    """'Type: first line of the message' (cut at `limit` characters), for a failed point."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:limit] if text else ''}"


@dataclass
class ProfilePoint:
    """Everything measured at one batch size."""

    batch: int
    status: str
    """ok | oom | error"""
    steps: int = 0
    step_s: float | None = None
    """forward + backward + optimizer, synchronized, per step."""
    wall_step_s: float | None = None
    """Wall time per step, batch creation included: the independent check on the three parts."""
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    tokens_per_s: float | None = None
    """Non-padding tokens per second."""
    samples_per_s: float | None = None
    padded_len_mean: float | None = None
    memory: dict[str, Any] | None = None
    """Peak of the longest batch: MemoryReport.to_dict() (a rank adds phase_peak_bytes and peak_phase)."""
    layer_times: dict[str, Any] | None = None
    """Seconds by layer type per step (forward, backward, recompute); on CUDA from the hooked steps."""
    expert_load: dict[str, Any] | None = None
    """[layer][expert] token counts over the timed steps (CUDA: the hooked steps), imbalance statistics."""
    utilization: dict[str, Any] | None = None
    hooked_step_s: float | None = None
    """CUDA: step time with the layer timer's synchronizing hooks, measured in steps of their own (layer_times
    and expert_load come from those); step_s is from bare steps."""
    hooks_in_timed_steps: bool = False
    """The layer timer's hooks ran inside the timed steps (on CUDA that makes step_s read slow). Stores written
    before profile gave the hooks steps of their own have no hooked_step_s: read back, they say True."""
    error: str | None = None
    estimate: dict[str, Any] | None = None
    """ftscope's estimate for the model as built (memory, limits, time) at this batch size."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def failed(cls, batch: int, exc: BaseException, limit: int = 600, **extra: Any) -> "ProfilePoint":
        """The point of a batch whose step raised: status oom (an out-of-memory error) or error."""
        from .meters import is_oom

        return cls(batch=batch, status="oom" if is_oom(exc) else "error", error=error_text(exc, limit), **extra)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProfilePoint":
        """A stored point (fields it lacks keep their defaults; keys that are no field are ignored)."""
        known = {f.name for f in fields(cls)}
        point = cls(**{k: v for k, v in d.items() if k in known})
        if "hooks_in_timed_steps" not in d:
            point.hooks_in_timed_steps = "hooked_step_s" not in d and "rank" not in d
        return point


@dataclass
class RankPoint(ProfilePoint):
    """What one rank of a distributed profile measured at one batch size (per optimizer step)."""

    rank: int = 0
    engine: str | None = None
    """ddp | deepspeed-zero1..3 | fsdp2"""
    gradient_accumulation: int = 1
    static_bytes: dict[str, int] | None = None
    """Tensor bytes alive between steps by holder: weights, gradients, optimizer, other."""
    collectives: dict[str, Any] | None = None
    """Time in collectives over one profiled step (measure/distributed/rank_metrics.collective_time)."""
    traceback: str | None = None


def point_from_dict(d: dict[str, Any]) -> ProfilePoint:
    """A stored measurement as its type: a RankPoint when it names a rank, else a ProfilePoint."""
    return RankPoint.from_dict(d) if "rank" in d else ProfilePoint.from_dict(d)


def batch_points(store: Store, run_id: int) -> list[ProfilePoint]:
    """The run's measured batch points (keys batch=B, or batch=B:rank=R) in the order they were recorded, typed,
    each carrying the estimate stored beside it."""
    out = []
    for p in store.points(run_id):
        if not p.key.startswith("batch="):
            continue
        point = point_from_dict(p.measurement)
        if point.estimate is None:
            point.estimate = p.estimate
        out.append(point)
    return out
