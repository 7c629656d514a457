"""The training engines a distributed profile wraps the model in: DeepSpeed ZeRO 1-3 (with offload), torch FSDP2,
torch DDP, chosen by the mix; the engine users train with, not an imitation (see worker.py for the rank program).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, ContextManager

from ..runtime.loop import Stepper, make_optimizer


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


class Engine(Stepper):
    """A wrapped model and the three timed parts of one training step (a Stepper over the engine's module).
    FSDP2 reduce-scatters every micro-batch into sharded gradients: the base step as it is."""

    def __init__(self, name: str, module: Any, optimizer: Any, device: str, autocast: Any) -> None:
        super().__init__(module, optimizer, device, autocast)
        self.name = name

    @property
    def module(self) -> Any:
        return self.model


class DDPEngine(Engine):
    """DDP skips the all-reduce on all but the last micro-batch (no_sync, as accelerate does)."""

    def _accumulating(self, last: bool) -> ContextManager[Any]:
        return contextlib.nullcontext() if last else self.model.no_sync()


class DeepSpeedEngine(Engine):
    """DeepSpeed runs its own backward and accumulates itself (gradient_accumulation_steps in its config),
    stepping at every micro-batch and updating at the boundary only."""

    def __init__(self, name: str, ds_engine: Any, optimizer: Any, device: str) -> None:
        super().__init__(name, ds_engine.module, optimizer, device, None)
        self.ds = ds_engine

    def _forward(self, batch: dict[str, Any]) -> Any:
        return self.ds(**batch).loss

    def _scale(self, loss: Any, micro_batches: int) -> Any:
        return loss  # DeepSpeed scales by its own gradient_accumulation_steps

    def _backward(self, loss: Any) -> None:
        self.ds.backward(loss)

    def _micro_step(self) -> float:
        t0 = time.perf_counter()
        self.ds.step()
        self._sync()
        return time.perf_counter() - t0

    def _optimizer_step(self) -> float:
        return 0.0


def make_engine(scn: Any, model: Any, info: Any, device: str, micro_batch: int, timeout_s: float,
                notes: list[str], ds_overrides: dict[str, Any] | None = None) -> tuple[Engine, dict[str, Any] | None]:
    """Wrap the built model in the mix's engine; returns (engine, the DeepSpeed config used or None)."""
    import torch

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
        return DeepSpeedEngine(name, ds, ds_opt, device), cfg
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
    return DDPEngine(name, ddp, opt, device, autocast), None
