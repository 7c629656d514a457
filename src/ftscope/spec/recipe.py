"""Framework recipes: what a fine-tuning framework does differently from the generic transformers + PEFT step.

A recipe is data (`catalog/recipes/<name>.yaml`), read into a typed `Recipe`: the framework version it
describes, the source lines each fact was read from, the defaults it gives the scenario's `mix:` and
`workload:` keys (a scenario's own keys win), and implementation facts the memory and time models read
(fp32 upcast under k-bit preparation, adapter dtype, loss implementation, checkpointing variant, ...). The
models never look at a framework's name, only at these fields.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Mapping

from ..errors import FtscopeError, unknown

DEFAULT_FRAMEWORK = "hf-trainer"
CHECKPOINT_IMPLS = ("non_reentrant", "reentrant", "offload")
ADAPTER_DTYPES = ("fp32", "bf16", "base")
VERIFIED = ("trace", "source")
KBIT_GROUPS = ("embeddings", "norms", "lm_head", "other")


@dataclass(frozen=True)
class Source:
    """Where a recipe fact was read."""

    repo: str
    """owner/name of the framework's public repository."""
    ref: str
    """The commit (or release tag) read."""
    path: str
    lines: str
    """Line range, e.g. '1106-1130'."""
    fact: str
    """What those lines establish."""


@dataclass(frozen=True, eq=False)
class Recipe:
    """One framework's training step, as far as memory and time are concerned."""

    name: str
    """The `framework:` value (hf-trainer, trl-sft, axolotl, ...)."""
    title: str
    version: str
    """Framework version (and the library versions that matter) the facts describe."""
    description: str = ""
    mix_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults for `mix:` keys the framework sets (its config's defaults): gradient checkpointing, loss, ..."""
    workload_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Defaults for `workload:` keys (padding: packed for frameworks that pack by default)."""
    kbit_fp32_params: tuple[str, ...] = ()
    """QLoRA: which parameters that are not 4-bit end up in fp32 after the framework's k-bit preparation
    (peft.prepare_model_for_kbit_training casts all of them): embeddings, norms, lm_head, other (MoE routers,
    fused expert stacks); `all` for every one. fp32 embeddings and norms make the residual stream fp32."""
    qlora_adapter_dtype: str = "fp32"
    """Dtype of LoRA adapters over a 4-bit base: fp32 (PEFT's autocast_adapter_dtype) | bf16 | base."""
    lora_adapter_dtype: str = "fp32"
    """Dtype of LoRA adapters over a bf16 base under bf16-mixed: fp32 (PEFT's default) | bf16 | base."""
    lora_base_fp32: bool = False
    """LoRA over a 16-bit base under bf16-mixed: the script loads the model without torch_dtype, so transformers
    (before 5) builds it in fp32 and the frozen base stays fp32 (FSDP shards it so and gathers bf16 copies under
    its MixedPrecision); DeepSpeed's bf16 engine casts the module to bf16. Adapters of dtype `base` follow it."""
    loss_chunks: int = 8
    """mix.loss chunked: number of output chunks (torchtune's num_output_chunks); 0: fixed-size chunks of
    loss_chunk_tokens tokens (LitGPT)."""
    loss_chunk_tokens: int = 128
    """mix.loss chunked with loss_chunks 0: tokens per chunk."""
    loss_tile_tokens: int = 4096
    """mix.loss fused_linear: tokens per logits tile (TRL's TOKEN_CHUNK_SIZE); the tile buffer stops growing there."""
    loss_tile_vocab: int = 32768
    """mix.loss fused_linear: vocabulary columns per logits tile (TRL's _CHUNKED_LOGPROB_CHUNK_SIZE)."""
    loss_fp32: bool = True
    """The cross-entropy runs on fp32 logits, so its saved log-softmax is fp32 (HF, torchtune upcast each chunk);
    False: on the compute dtype (LitGPT's chunked_cross_entropy on bf16 logits)."""
    loss_upcast_in_forward: bool = False
    """mix.loss standard: the model's forward returns fp32 logits (its bf16 output is freed at once): transformers
    before 4.46 (`logits = logits.float()` in LlamaForCausalLM.forward), torchtune's TransformerDecoder."""
    loss_shift_copy: bool = False
    """mix.loss standard: the loss shifts the logits with a contiguous copy (`logits[..., :-1, :].contiguous()`),
    alive beside them while the cross-entropy runs (transformers before 4.46); transformers 5 shifts the labels."""
    loss_logits_held: bool = False
    """mix.loss standard: the training loop keeps the model's output logits until its backward ends (fsdp_qlora
    keeps `output` until after `loss.backward()`; torchtune 0.1 its shifted `logits`); the HF Trainer drops them."""
    fused_gelu: bool = False
    """The model runs its tanh-approximated GELU as one fused op (litgpt: F.gelu(approximate='tanh')), where
    transformers' phi runs NewGELUActivation's elementwise formula and autograd keeps its intermediates."""
    fsdp_root_gathered: bool = False
    """FSDP1: the root unit (what no wrapped block owns: embeddings, final norm, LM head) is gathered at the start of
    forward and stays unsharded until backward ends (FSDP2 and ZeRO-3 reshard it like any block)."""
    fsdp1_sync_init: bool = False
    """FSDP1 built with sync_module_states from rank 0's CPU copy, then the peak counters reset without emptying the
    cache: each unit is moved to the GPU whole, broadcast through at most two 250 MiB buckets in flight, flattened
    into a copy and sharded; the allocator keeps those freed blocks, a floor under the step's reserved peak."""
    fsdp1_unshard_stream: bool = False
    """FSDP1 all-gathers each unit's full flat parameter on its own unshard stream; the caching allocator reuses a
    block only on the stream it was allocated on, so the gathered units (the root kept gathered, two blocks in
    flight under limit_all_gathers) form a pool the compute stream's tensors never use."""
    fsdp1_post_backward_stream: bool = False
    """FSDP1 reduce-scatters each unit's gradient on its post-backward stream into a sharded tensor it allocates
    there (torch/distributed/fsdp/_runtime_utils.py, _post_backward_hook: `with ... stream(_post_backward_stream)`,
    `new_sharded_grad = torch.empty_like(chunks[0])`, kept as `_saved_grad_shard`, then the optimizer's `.grad`; the
    same in torch 2.0-2.13). Freed at zero_grad, those blocks stay in that stream's pool: from the second step on the
    next forward's activations cannot use them, so the sharded gradients stay reserved through the whole step."""
    checkpoint_impl: str = "non_reentrant"
    """How gradient checkpointing runs: non_reentrant (torch.utils.checkpoint, use_reentrant=False: stops
    recomputing at the block's last saved tensor) | reentrant (recomputes the whole block) | offload (block
    inputs kept in CPU RAM, Unsloth's offloaded checkpointing)."""
    kbit_matmul_keeps_input: bool = False
    """QLoRA: the 4-bit matmul keeps its input as a ctx attribute whenever the input needs grad (bitsandbytes <=
    0.43.1's MatMul4Bit: `ctx.tensors = (A, B)`, removed by PR #1270). Non-reentrant checkpointing frees only
    what goes through save_for_backward, so under it every such input stays until the backward ends."""
    dequant_bytes_per_weight: float = 2.0
    """QLoRA: bytes per weight element alive while one 4-bit weight is dequantized for its matmul: bitsandbytes'
    kernel writes the bf16 weight (2); torchao's NF4Tensor.get_original_weight holds both nibbles as int64 and
    three bf16 intermediates (14)."""
    kbit_state_sharded: bool = False
    """QLoRA under FSDP / ZeRO-3: the 4-bit weights' quantization state is sharded with them (torchao's NF4Tensor
    splits its scalers with its data, nf4_split). False: bitsandbytes, whose Linear4bit keeps its quant_state
    (absmax, quantized again under mix.nested_quant: kbit_state_bytes_per_weight) as a plain attribute, neither
    parameter nor buffer, made on every rank's GPU at load: whole on every rank, and left there when FSDP offloads
    the parameters. Gathered units then hold the 4-bit data alone."""
    nested_quant_fixed: bool = False
    """QLoRA's 4-bit format always quantizes its scales again (torchao's NF4Tensor: an int8 per 64 weights), so a
    scenario's mix.nested_quant false describes a run the framework cannot make: refused, not estimated."""
    adamw_fused: bool = False
    """The framework's AdamW is torch's fused kernel (fused=True): states updated in place, none of the foreach
    implementation's per-parameter temporaries at the step."""
    init_quantize_bytes_per_weight: float = 0.0
    """QLoRA on one GPU: bytes per weight element the model's init allocates while quantizing its largest matrix on
    the GPU, kept reserved when the recipe resets the peak counters without emptying the cache (0: not modelled).
    torchao 0.1's to_nf4 compares every element with the 16 NF4 levels at once: the bf16 input and its scaled copy
    (2 + 2), the (n, 16) bf16 difference and its abs (32 + 32)."""
    init_layer_clones: bool = False
    """QLoRA on one GPU: the model builder builds one decoder layer and deep-copies it for every layer (torchtune 0.1's
    TransformerDecoder `_get_clones`), a 4-bit weight's clone dequantizes it and quantizes it again, and
    load_state_dict moves each checkpoint weight to the GPU and quantizes it there (torchtune 0.1's aten.clone and
    aten.copy_ for NF4): the init is replayed through the caching-allocator model (reserved_floor.clone_init_cache)
    instead of the one-matrix closed form of `init_quantize_bytes_per_weight` (dense models: torchtune 0.1 built no
    MoE, which keeps the closed form)."""
    compiled_dequant_saved: bool = False
    """QLoRA under torch.compile: Inductor fuses the 4-bit dequantization into one kernel writing the bf16 weight
    (2 B per weight, not dequant_bytes_per_weight) and the compiled block saves that weight for its backward, so
    a whole block's weights are alive while it runs (torchao NF4Tensor: a trace of the compiled step)."""
    compile: bool = False
    """torch.compile on the model by default (time model)."""
    allocator_fragmentation_checkpointed: float | None = None
    """This framework's own AllocatorModel.fragmentation_checkpointed: reserved minus allocated over the churning bytes
    when its checkpointed step (its loss code included) is traced and replayed through the caching-allocator model
    (benchmarks/recipe_fragmentation.py); None: the H200 fit."""
    nccl_version: str = "2.27"
    """The NCCL the framework's torch ships (torch 2.2: 2.19, 2.4: 2.20, 2.5: 2.21, 2.9: 2.27): what its
    communicators allocate outside the caching allocator (estimate/comm_buffers.py)."""
    quantize_at_load: bool = True
    """QLoRA weights are quantized while loading, one bf16 tensor at a time (not a full bf16 copy)."""
    gpu_only: bool = False
    """The framework needs a GPU to run at all (its recipe is read from source, not traced here)."""
    verified: str = "source"
    """trace: checked against a fake-tensor trace of the framework's own step | source: read from its code."""
    sources: tuple[Source, ...] = ()
    notes: tuple[str, ...] = ()

    def kbit_fp32(self, group: str) -> bool:
        """Whether a QLoRA run of this framework keeps this group of non-4-bit parameters in fp32."""
        return group in self.kbit_fp32_params or "all" in self.kbit_fp32_params

    def adapter_dtype(self, method: str) -> str:
        """Adapter dtype for a LoRA method: fp32, bf16 or base (an fp32-loaded base's adapters are fp32)."""
        if method == "qlora":
            return self.qlora_adapter_dtype
        return "fp32" if self.lora_base_fp32 and self.lora_adapter_dtype == "base" else self.lora_adapter_dtype

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sources", "notes")}
        out["mix_defaults"] = dict(self.mix_defaults)
        out["workload_defaults"] = dict(self.workload_defaults)
        out["sources"] = [s.__dict__ for s in self.sources]
        out["notes"] = list(self.notes)
        return out


_SCALARS = {f.name for f in fields(Recipe)} - {"sources", "notes", "mix_defaults", "workload_defaults"}


def recipe_from_dict(raw: Mapping[str, Any]) -> Recipe:
    """A checked Recipe from a recipe file's mapping; a malformed file is a one-line FtscopeError."""
    name = raw.get("name")
    try:
        sources = tuple(Source(**s) for s in raw.get("sources") or ())
        known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in _SCALARS}
        extra = set(raw) - _SCALARS - {"sources", "notes", "mix_defaults", "workload_defaults"}
        if extra:
            raise FtscopeError(f"recipe {name}: unknown keys {sorted(extra)}")
        rec = Recipe(**known, mix_defaults=dict(raw.get("mix_defaults") or {}),
                     workload_defaults=dict(raw.get("workload_defaults") or {}),
                     sources=sources, notes=tuple(raw.get("notes") or ()))
    except TypeError as exc:
        raise FtscopeError(f"recipe {name}: {exc}") from None
    for key, value, options in (("checkpoint_impl", rec.checkpoint_impl, CHECKPOINT_IMPLS),
                                ("qlora_adapter_dtype", rec.qlora_adapter_dtype, ADAPTER_DTYPES),
                                ("lora_adapter_dtype", rec.lora_adapter_dtype, ADAPTER_DTYPES),
                                ("verified", rec.verified, VERIFIED)):
        if value not in options:
            raise FtscopeError(f"recipe {rec.name}: {key} must be one of {', '.join(options)}; got {value!r}")
    frag = rec.allocator_fragmentation_checkpointed
    if frag is not None and not (isinstance(frag, (int, float)) and 0.0 <= frag <= 2.0):
        raise FtscopeError(f"recipe {rec.name}: allocator_fragmentation_checkpointed must be a number from 0 to 2; got {frag!r}")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(rec.nccl_version)):
        raise FtscopeError(f"recipe {rec.name}: nccl_version must read like 2.21 or 2.27.5; got {rec.nccl_version!r}")
    if rec.loss_chunk_tokens < 1 or rec.loss_chunks < 0:
        raise FtscopeError(f"recipe {rec.name}: loss_chunk_tokens must be positive and loss_chunks not negative")
    bad = set(rec.kbit_fp32_params) - set(KBIT_GROUPS) - {"all"}
    if bad:
        raise FtscopeError(f"recipe {rec.name}: kbit_fp32_params must name {', '.join(KBIT_GROUPS)} or all; got {sorted(bad)}")
    return rec


@lru_cache(maxsize=None)
def framework_names() -> tuple[str, ...]:
    from .. import catalog

    return tuple(sorted(catalog.recipe_names()))


@lru_cache(maxsize=None)
def load_recipe(name: str = DEFAULT_FRAMEWORK) -> Recipe:
    """The bundled recipe of a framework (`ftscope` catalog/recipes/<name>.yaml)."""
    from .. import catalog

    if not isinstance(name, str) or name.lower() not in framework_names():
        raise unknown("framework", str(name), framework_names())
    return recipe_from_dict(catalog.recipe_data(name.lower()))
