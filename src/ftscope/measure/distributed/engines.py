"""The training engines a distributed profile wraps the model in: DeepSpeed ZeRO 1-3 (with offload), torch FSDP2,
torch DDP, chosen by the mix; the engine users train with, not an imitation (see dist_worker for the rank program).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable


steps_done = 0
"""Training steps this process has run (the failure-injection test hook counts them)."""


def engine_name(mix: Any) -> str:
    if mix.fsdp is not None:
        return "fsdp2"
    if mix.zero_stage > 0:
        return f"deepspeed-zero{mix.zero_stage}"
    return "ddp"


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks (the classes HF names in `_no_split_modules`)."""
    base = _base_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise RuntimeError(f"{type(base).__name__} names no decoder-layer class (_no_split_modules) to shard")
    return layers


def moe_block_classes(model: Any) -> list[type]:
    """Classes of the modules that own an `experts` child (the MoE blocks)."""
    seen: dict[str, type] = {}
    for m in model.modules():
        if "experts" in dict(m.named_children()):
            seen.setdefault(type(m).__name__, type(m))
    return list(seen.values())


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def run_deepspeed_config(scn: Any, micro_batch: int, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """plan.emit's DeepSpeed config plus what running it with ftscope's client optimizer needs, then the
    caller's overrides (merged key by key)."""
    from ...plan.emit import deepspeed_config

    cfg = deepspeed_config(scn, micro_batch) or {}
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["zero_allow_untested_optimizer"] = True  # the client optimizer is torch AdamW (the CPU stack facts)
    if scn.mix.offload != "none":
        cfg["zero_force_ds_cpu_optimizer"] = False  # torch AdamW on the offloaded partition, not DeepSpeedCPUAdam
    cfg["steps_per_print"] = 10**9
    cfg["wall_clock_breakdown"] = False
    return _merge(cfg, overrides or {})


class Engine:
    """A wrapped model and the three timed parts of one training step."""

    def __init__(self, name: str, module: Any, optimizer: Any, device: str, autocast: Any,
                 ds_engine: Any = None) -> None:
        import torch

        self.torch, self.name, self.module, self.opt, self.device = torch, name, module, optimizer, device
        self.autocast, self.ds = autocast, ds_engine

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _forward(self, batch: dict[str, Any]) -> Any:
        if self.ds is not None:
            return self.ds(**batch).loss
        if self.autocast is not None:
            dev_type = "cuda" if self.device.startswith("cuda") else "cpu"
            with self.torch.autocast(device_type=dev_type, dtype=self.autocast):
                return self.module(**batch).loss
        return self.module(**batch).loss

    def step(self, batches: list[dict[str, Any]], mark: Callable[[str], None] | None = None
             ) -> tuple[float, float, float]:
        """One optimizer step over the micro-batches (gradient accumulation): summed forward, backward and
        optimizer seconds. `mark(phase)` is called after each phase, outside the timed parts. DDP skips the
        all-reduce on all but the last micro-batch (no_sync, as accelerate does); DeepSpeed accumulates itself
        (gradient_accumulation_steps in its config); FSDP2 reduce-scatters every micro-batch into sharded grads."""
        global steps_done
        mark = mark or (lambda _phase: None)
        fwd = bwd = opt = 0.0
        n = len(batches)
        for i, batch in enumerate(batches):
            last = i == n - 1
            sync = self.module.no_sync() if (self.name == "ddp" and not last) else contextlib.nullcontext()
            with sync:
                self._sync()
                t0 = time.perf_counter()
                loss = self._forward(batch)
                if self.ds is None and n > 1:
                    loss = loss / n  # DeepSpeed scales by its own gradient_accumulation_steps
                self._sync()
                fwd += time.perf_counter() - t0
                mark("forward")
                t0 = time.perf_counter()
                if self.ds is not None:
                    self.ds.backward(loss)
                else:
                    loss.backward()
                self._sync()
                bwd += time.perf_counter() - t0
                mark("backward")
            if self.ds is not None:  # every micro-step: DeepSpeed steps the optimizer at the boundary only
                t0 = time.perf_counter()
                self.ds.step()
                self._sync()
                opt += time.perf_counter() - t0
        if self.ds is None:
            t0 = time.perf_counter()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self._sync()
            opt += time.perf_counter() - t0
        mark("optimizer")
        steps_done += 1
        return fwd, bwd, opt


def make_engine(scn: Any, model: Any, info: Any, device: str, micro_batch: int, timeout_s: float,
                notes: list[str], ds_overrides: dict[str, Any] | None = None) -> tuple[Engine, dict[str, Any] | None]:
    """Wrap the built model in the mix's engine; returns (engine, the DeepSpeed config used or None)."""
    import torch

    from ..runtime.profile import make_optimizer

    mix = scn.mix
    name = engine_name(mix)
    autocast = getattr(torch, info.autocast_dtype) if info.autocast_dtype else None
    if name.startswith("deepspeed"):
        import deepspeed
        from datetime import timedelta

        deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo",
                                   timeout=timedelta(seconds=timeout_s), verbose=False)
        cfg = run_deepspeed_config(scn, micro_batch, ds_overrides)
        if mix.zero_stage == 3 and scn.model.is_moe:
            classes = moe_block_classes(model)
            if classes:
                deepspeed.utils.set_z3_leaf_modules(model, classes)
                notes.append("ZeRO-3 leaf modules: " + ", ".join(c.__name__ for c in classes))
        if mix.optimizer != "adamw":
            notes.append(f"optimizer {mix.optimizer} passed to DeepSpeed as a client optimizer")
        opt = make_optimizer(model, scn)
        ds, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        return Engine(name, ds.module, ds_opt, device, None, ds_engine=ds), cfg
    if name == "fsdp2":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {"reshard_after_forward": mix.fsdp == "full_shard"}
        if info.autocast_dtype is not None:
            dtype = getattr(torch, info.autocast_dtype)  # accelerate's FSDP2 policy: param and reduce dtype
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
            autocast = None  # FSDP2 casts the gathered parameters itself
        if mix.offload == "optimizer+params":
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.startswith("cuda"))
        elif mix.offload == "optimizer":
            notes.append("FSDP2 has no optimizer-only offload: optimizer state stays on the device")
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        opt = make_optimizer(model, scn)
        return Engine(name, model, opt, device, autocast), None
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.device(device).index] if device.startswith("cuda") else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    opt = make_optimizer(model, scn)
    return Engine(name, ddp, opt, device, autocast), None
