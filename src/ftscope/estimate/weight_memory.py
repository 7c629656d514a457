"""Bytes of the weights beyond the trained states (state_memory.py): the frozen base by method, and what forward keeps
beside it (autocast copies, dequantized and gathered weights).

Bytes per parameter, by where the weights live (N = GPUs that share a shard):
- full, bf16-mixed without DeepSpeed/FSDP (torch AMP): fp32 weights 4 + fp32 grads 4 + AdamW 8; autocast keeps a
  bf16 copy of every weight used in forward (2) until backward frees it;
- full under ZeRO (bf16 weights 2, bf16 grads 2, fp32 master + AdamW 12) with ZeRO-1 sharding the 12,
  ZeRO-2 also the grads, ZeRO-3 also the weights; FSDP2 keeps fp32 sharded params and gathers bf16 per block;
- LoRA: frozen bf16 base 2; adapters fp32 (PEFT upcasts them) + grads + AdamW;
- QLoRA: NF4, 0.5 bytes of data per quantized weight plus its quantization state: 1/64 + 4/16384 under nested
  (double) quantization, 4/64 without (`mix.nested_quant`); embeddings, norms and LM head stay bf16; one block's
  weights are dequantized to bf16 at a time. Under FSDP / ZeRO-3 the 4-bit data is sharded; bitsandbytes'
  quantization state stays whole on every rank (`kbit_state_bytes`).
"""
from __future__ import annotations

from ..spec.scenario import Scenario
from .state_memory import trainable_params
from .adapter_memory import (kbit_autocast_copies, kbit_fp32_params, largest_dequantized_linear,
                             peft_merged_expert_bytes)

NF4_DATA_BYTES = 0.5
"""4-bit data per quantized weight, two weights a byte (packed into the quant storage dtype)."""
# bitsandbytes' quantize_4bit (bitsandbytes-foundation/bitsandbytes 95f9af30, bitsandbytes/functional.py lines
# 884-962; the fake op's fp32 absmax: bitsandbytes/_ops.py line 234): blocks of 64 weights, one fp32 absmax each;
# with compress_statistics (nested) the absmax less their mean (one fp32 offset per tensor) are quantized again by
# quantize_blockwise(blocksize=256) to a uint8 each, with one fp32 absmax per 256 of them (state2).
NF4_STATE_BYTES = 1 / 64 + 4 / (64 * 256)
"""Quantization state per weight under nested (double) quantization: a uint8 absmax per block of 64 weights and an
fp32 absmax per 256 of those (bitsandbytes' QuantState and its state2). torchao's NF4Tensor, which always
double-quantizes, keeps an int8 scaler per 64 and a bf16 factor per 256 of them (nf4tensor.py v0.1, lines 292-347):
2 / 16384 less per weight, 1 MB at 8B, not told apart."""
NF4_STATE_BYTES_PLAIN = 4 / 64
"""Quantization state per weight without nested quantization: one fp32 absmax per block of 64 weights."""
NF4_BYTES = NF4_DATA_BYTES + NF4_STATE_BYTES
"""Bytes per 4-bit weight under nested quantization (0.516); `kbit_bytes_per_weight` reads the scenario's setting."""
ZERO3_MAX_REUSE_DISTANCE = 1e9
"""DeepSpeed's stage3_max_reuse_distance default, in parameter elements (HF's "auto" and accelerate's generated
configs leave it): a submodule's parameters stay gathered after it runs when the trace uses them again within that
many elements (partitioned_param_coordinator.__params_to_release, v0.13.4)."""


def frozen_weight_bytes(scn: Scenario) -> float:
    """Bytes of the frozen base weights (none for full fine-tuning): NF4 for what bitsandbytes quantizes."""
    m, mix = scn.model, scn.mix
    total = m.total_params
    if mix.method == "qlora":
        quantized = quantized_params(scn)
        return (quantized * kbit_bytes_per_weight(scn) + (total - quantized) * 2.0
                + kbit_fp32_params(scn, quantized) * 2.0)
    frozen = 0 if mix.method == "full" else total
    return frozen * (4.0 if mix.precision == "fp32" or fp32_lora_base(scn) else 2.0)


def kbit_state_bytes_per_weight(scn: Scenario) -> float:
    """Bytes of quantization state per 4-bit weight: nested (double) quantization or one fp32 absmax per 64."""
    return NF4_STATE_BYTES if scn.mix.nested_quant else NF4_STATE_BYTES_PLAIN


def kbit_bytes_per_weight(scn: Scenario) -> float:
    """Bytes per 4-bit weight, data and quantization state: 0.516 nested, 0.5625 not."""
    return NF4_DATA_BYTES + kbit_state_bytes_per_weight(scn)


def quantized_params(scn: Scenario) -> int:
    """QLoRA: the weights bitsandbytes quantizes (nn.Linear only: transformers 5's fused 3-D experts stay bf16)."""
    m = scn.model
    quantized = m.quantizable_params()
    if m.is_moe and scn.mix.fused_experts:
        quantized -= sum(lin.params * k for lin, k in m.linears() if lin.group == "experts")
    return quantized


def kbit_state_bytes(scn: Scenario) -> float:
    """Bytes of frozen_weight_bytes that every data-parallel rank keeps whole on its GPU, never sharded nor
    offloaded: bitsandbytes' quantization state. transformers quantizes each weight on the rank's own GPU and moves
    only the 4-bit data to the CPU or meta device (`type(value)(value.data.to(param_to), **value.__dict__)`,
    modeling_utils 4.39), fsdp_qlora's train.py does the same (its load_and_quantize comment: "FSDP only syncs
    parameters and buffers, so the quant_state isn't copied"), and FSDP / ZeRO-3 then shard the data alone."""
    if scn.mix.method != "qlora" or scn.recipe.kbit_state_sharded:
        return 0.0
    return quantized_params(scn) * kbit_state_bytes_per_weight(scn)


def gathered_bytes_per_weight(scn: Scenario) -> float:
    """Bytes per weight of a block that FSDP / ZeRO-3 all-gathers: bf16, or the 4-bit data (with the scalers when the
    recipe shards them with it, kbit_state_sharded). The one source for the memory model's gathered units and the
    time model's all-gathers (`gathered_weight_bytes`).

    bitsandbytes gathers the data alone. Params4bit is a torch.nn.Parameter whose quantization state is a Python
    attribute (bitsandbytes-foundation/bitsandbytes 95f9af30, bitsandbytes/nn/modules.py line 237, set again on
    the Linear4bit by _quantize, lines 391-393), packed two weights a byte into the quant_storage dtype
    (functional.py quantize_4bit, lines 891-906): 0.5 bytes a weight whatever that dtype (PEFT 5d602fdb,
    docs/source/accelerate/fsdp.md lines 242-245 and deepspeed.md 241-244 set it to bf16 so FSDP / ZeRO-3 flatten
    it with the bf16 weights). FSDP flattens the tensor and drops the attribute, which Linear4bit.forward restores
    from the module ("the quant state got lost when the parameter got converted. This happens for example for
    fsdp", modules.py lines 487-501, called at 610); DeepSpeed ZeRO-3 partitions the tensor's own elements
    (microsoft/DeepSpeed 38327e07, deepspeed/runtime/zero/partition_parameters.py line 1609: torch.empty(
    partition_size, dtype=param.dtype)) and all_gather_coalesced rebuilds param.data from them (line 1266).
    torchao's NF4Tensor gathers its scalers too: fsdp_pre_all_gather returns (quantized_scalers,
    quantization_factor, quantized_data) (pytorch/ao 36027d82, torchao/quantization/quantize_/workflows/nf4/
    nf4_tensor.py lines 976-998)."""
    if scn.mix.method != "qlora":
        return dense_gathered_bytes(scn)
    return kbit_bytes_per_weight(scn) if scn.recipe.kbit_state_sharded else NF4_DATA_BYTES


def dense_gathered_bytes(scn: Scenario) -> float:
    """Bytes per unquantized weight of a ZeRO-3 / FSDP all-gather: the compute dtype (FSDP's param_dtype, DeepSpeed's
    bf16 / fp16 module), fp32 only when the run is fp32."""
    return 4.0 if scn.mix.precision == "fp32" else 2.0


def gathered_weight_bytes(scn: Scenario) -> float:
    """Bytes of one all-gather of every weight under ZeRO-3 / FSDP full_shard (forward, recompute or backward):
    each 4-bit weight at `gathered_bytes_per_weight`, what QLoRA leaves unquantized (embeddings, norms, LM head,
    transformers 5's fused expert stacks) in bf16 like every weight of LoRA and full fine-tuning (FSDP's
    param_dtype, DeepSpeed's bf16 module), and the LoRA adapters, parameters of the wrapped blocks gathered with
    them in the same dtype (about 5 % of a QLoRA gather at rank 64 on every linear)."""
    total = scn.model.total_params
    adapters = (trainable_params(scn) if scn.mix.trains_lora else 0) * dense_gathered_bytes(scn)
    if scn.mix.method != "qlora":
        return total * gathered_bytes_per_weight(scn) + adapters
    quantized = quantized_params(scn)
    return quantized * gathered_bytes_per_weight(scn) + (total - quantized) * dense_gathered_bytes(scn) + adapters


def gathered_unit_bytes(scn: Scenario) -> float:
    """Bytes of the largest block's all-gather under ZeRO-3 / FSDP (the unit forward_transients holds twice): its
    4-bit matrices at `gathered_bytes_per_weight`, the rest of a QLoRA block (norms, routers, transformers 5's
    fused expert stacks) and its LoRA adapters in bf16; `gathered_weight_bytes` over one block."""
    per, dense = gathered_bytes_per_weight(scn), dense_gathered_bytes(scn)
    m, mix = scn.model, scn.mix
    fused = mix.fused_experts
    adapters_per_layer = (m.lora_layer_params(mix.lora_rank, mix.lora_targets, m.is_moe and fused) if mix.trains_lora
                          else (0,) * len(m.layer_groups))
    out = 0.0
    for (layer, _), lora in zip(m.layer_groups, adapters_per_layer):
        adapters = lora * dense
        if mix.method != "qlora":
            out = max(out, layer.params * per + adapters)
            continue
        quantized = sum(lin.params for lin in layer.linears
                        if lin.group != "router" and not (fused and lin.group == "experts"))
        out = max(out, quantized * per + (layer.params - quantized) * dense + adapters)
    return out


def fp32_lora_base(scn: Scenario) -> bool:
    """A LoRA base the recipe loads in fp32 and keeps so under mixed precision (DeepSpeed's bf16 engine casts it)."""
    mix = scn.mix
    return (scn.recipe.lora_base_fp32 and mix.method == "lora" and mix.zero_stage == 0
            and mix.precision in ("bf16-mixed", "fp16-mixed"))


def forward_transients(scn: Scenario) -> tuple[float, float]:
    """(bytes alive through forward and backward, bytes alive while one block computes): autocast's weight cache,
    dequantized and merged weights, ZeRO-3 / FSDP gathers."""
    m, mix = scn.model, scn.mix
    deepspeed, fsdp = mix.zero_stage > 0, mix.fsdp is not None
    mixed = mix.precision in ("bf16-mixed", "fp16-mixed")
    transient = block = 0.0
    if mix.method == "full" and mixed and not deepspeed and not fsdp:
        transient += m.total_params * 2.0       # autocast's bf16 weight cache, kept for backward
    if mix.method == "qlora":
        largest = largest_dequantized_linear(m, mix.fused_experts)
        block += largest * scn.recipe.dequant_bytes_per_weight  # the dequantized weight of the matmul in flight
        if scn.recipe.compiled_dequant_saved and (mix.compile or scn.recipe.compile):
            block = m.largest_layer_params() * 2.0  # compiled: each fused bf16 dequantization saved for backward
    head_copy, stack_copies = kbit_autocast_copies(scn)
    transient += head_copy
    if mix.gradient_checkpointing:
        block += max(stack_copies, default=0.0)
        block += peft_merged_expert_bytes(scn)  # one recomputed layer's
    else:
        transient += sum(stack_copies)
        transient += peft_merged_expert_bytes(scn)  # every layer's, saved for backward
    if mix.shard_stage == 3:
        # ZeRO-3/FSDP gather the current block and prefetch the next (MoE blocks are gathered whole), each into a
        # buffer of the whole unit beside the rank's shard, which stays (FSDP1's padded unsharded flat parameter,
        # FSDP2's all-gather output, DeepSpeed's all_gather_coalesced flat tensor): the full unit, not (n - 1) / n
        unit = gathered_unit_bytes(scn)
        gathered = 2 * unit
        if deepspeed:
            gathered = max(gathered, zero3_reuse_kept(scn, unit))
        transient += gathered
        if scn.recipe.fsdp_root_gathered and fsdp:
            root = m.embedding_params + m.lm_head_params + m.final_norm_params
            transient += root * (4.0 if mix.precision == "fp32" else 2.0)
    elif fsdp:
        # shard_grad_op "unshards before the forward, does not reshard them after the forward, and only reshards
        # them after the backward" (torch/distributed/fsdp/api.py, ShardingStrategy): every unit, frozen or not
        transient += gathered_weight_bytes(scn)
    return transient, block


def zero3_reuse_kept(scn: Scenario, unit_bytes: float) -> float:
    """Bytes DeepSpeed's ZeRO-3 keeps gathered where forward turns into backward: the LM head and the last blocks
    (`unit_bytes` each), whose next use (their backward, under checkpointing their recompute) comes within
    ZERO3_MAX_REUSE_DISTANCE elements of the trace. The block j from the end stays while the j blocks after it and
    the head hold fewer elements; every element is 2 bytes: bf16 weights, or the bf16 quant storage 4-bit data is
    packed into (a Llama-2-70B NF4 block: 214M)."""
    m = scn.model
    elements = unit_bytes / 2.0
    head = m.lm_head_params + m.final_norm_params
    kept = 0 if head >= ZERO3_MAX_REUSE_DISTANCE else int((ZERO3_MAX_REUSE_DISTANCE - head) // elements) + 1
    return min(kept, m.num_layers) * unit_bytes + head * 2.0
