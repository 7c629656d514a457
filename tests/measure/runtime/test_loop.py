"""The one step loop (measure/runtime/loop.py): sums and rates of timed steps, the typed points and how stored
ones read back, and the Stepper's gradient accumulation."""
from __future__ import annotations

import pytest

from ftscope.measure.runtime.batches import BatchShape
from ftscope.measure.runtime.loop import (ProfilePoint, RankPoint, StepTotals, batch_points, error_text,
                                          point_from_dict, timed_steps)
from ftscope.measure.store import Store


def test_timed_steps_sum_times_tokens_and_padding():
    shapes = {1: [BatchShape((3, 5), 5)], 2: [BatchShape((4,), 4), BatchShape((2, 2), 2)]}
    times = {1: (0.5, 1.0, 0.25), 2: (1.5, 3.0, 0.75)}
    totals = timed_steps(lambda i: (times[i], shapes[i]), [1, 2])
    assert (totals.steps, totals.tokens, totals.samples) == (2, 8 + 8, 2 + 3)
    assert totals.padded_len == 5 + (4 + 2) / 2  # a step's micro-batches count by their mean padded length
    f = totals.point_fields()
    assert f["step_s"] == pytest.approx((1.75 + 5.25) / 2)
    assert f["forward_s"] == pytest.approx(1.0) and f["optimizer_s"] == pytest.approx(0.5)
    assert f["tokens_per_s"] == pytest.approx(16 / 7.0) and f["samples_per_s"] == pytest.approx(5 / 7.0)
    assert f["wall_step_s"] == totals.wall_s / 2 > 0


def test_timed_steps_continue_given_totals():
    totals = StepTotals()
    for _ in range(2):
        timed_steps(lambda _: ((1.0, 1.0, 1.0), [BatchShape((2,), 2)]), range(3), totals)
    assert totals.steps == 6 and totals.compute_s == pytest.approx(18.0)


def test_failed_point_says_oom_or_error():
    from ftscope.measure.runtime.tracker import SimulatedOOM

    oom = ProfilePoint.failed(4, SimulatedOOM(10, 20, 25))
    assert oom.status == "oom" and oom.error.startswith("SimulatedOOM: Simulated out of memory")
    err = ProfilePoint.failed(4, ValueError("  bad\nsecond line"), limit=2)
    assert (err.status, err.error) == ("error", "ValueError: ba")
    assert error_text(RuntimeError("")) == "RuntimeError: "


def test_stored_points_read_back_typed():
    point = ProfilePoint(batch=2, status="ok", step_s=0.5, hooked_step_s=0.7, memory={"peak_allocated_bytes": 9})
    assert point_from_dict(point.to_dict()) == point
    rank = RankPoint(batch=1, status="ok", rank=1, engine="ddp", collectives={"collective_s": 0.1})
    assert point_from_dict(rank.to_dict()) == rank
    assert point_from_dict({"batch": 1, "status": "ok", "a_future_field": 1}).batch == 1
    # stores written before the hooks got steps of their own have no hooked_step_s: their timing was hooked
    assert point_from_dict({"batch": 1, "status": "ok", "step_s": 0.3}).hooks_in_timed_steps is True
    assert point_from_dict({"batch": 1, "status": "ok", "hooked_step_s": None}).hooks_in_timed_steps is False
    assert point_from_dict({"batch": 1, "status": "ok", "rank": 0}).hooks_in_timed_steps is False


def test_batch_points_carry_the_estimate_stored_beside_them(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        run = store.start_run({"scenario": {}}, {})
        store.record_point(run, "batch=1", "ok", ProfilePoint(batch=1, status="ok", step_s=0.1).to_dict(), {"e": 1})
        store.record_point(run, "maxbatch", "ok", {"max_batch": 3})
        store.record_point(run, "batch=2:rank=0", "oom", RankPoint(batch=2, status="oom", rank=0).to_dict(), None)
        points = batch_points(store, run)
    assert [type(p).__name__ for p in points] == ["ProfilePoint", "RankPoint"]
    assert points[0].estimate == {"e": 1} and points[1].estimate is None


def test_stepper_averages_micro_batches_like_one_batch():
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from ftscope.measure.runtime.loop import Stepper

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):  # noqa: ANN001
            return SimpleNamespace(loss=(self.w * x).sum() ** 2)

    grads = []
    for batches in ([{"x": torch.arange(3.0)}], [{"x": torch.arange(3.0)}] * 2):
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        seen = []
        stepper = Stepper(model, opt, "cpu", None)
        stepper.opt.zero_grad = lambda set_to_none=True: None  # keep the gradient to compare it
        times = stepper.step(batches, mark=seen.append)
        assert all(t >= 0 for t in times) and stepper.steps_done == 1
        assert seen == ["forward", "backward"] * len(batches) + ["optimizer"]
        grads.append(model.w.grad.clone())
    assert torch.allclose(grads[0], grads[1])  # the loss of each of n micro-batches is scaled by 1/n
