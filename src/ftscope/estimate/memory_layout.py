"""Per-GPU memory under a parallel layout and the activation policies beyond full checkpointing.

memory.py builds one data-parallel rank's memory as if it held the whole model; this module then splits it:
- tensor x pipeline parallelism hold 1 / (tp x pp) of every weight, gradient and optimizer state (routed experts
  also 1 / ep), and so of the gathered blocks and optimizer temporaries;
- tensor parallelism splits each block's activations over its ranks with sequence parallelism; without it the
  norms' and residuals' inputs (about half the bytes) stay whole on every rank; context parallelism splits the
  tokens; a 1F1B pipeline's first stage holds pp micro-batches of its 1 / pp of the blocks: one micro-batch of
  every block, as without a pipeline (interleaving adds (pp - 1) / (pp x v) more);
- Megatron's selective checkpointing saves everything but the attention core (for fused attention that is
  about all of it; eager attention's scores are dropped); torchtitan's per-op policy keeps the matmul inputs and
  outputs and recomputes the elementwise ops between them (the norms' fp32 copies and two of the gated MLP's
  intermediates); torch.compile's partition recomputes the norms and one MLP intermediate (a traced block);
  checkpoint_every N keeps full activations for the other blocks;
- the optimizer step fused into backward holds one block's gradients at a time, and so does FSDP's CPU offload
  (it copies each sharded gradient to the host); activation offload keeps only the block being computed and the
  next one's prefetched activations on the GPU (under checkpointing: two blocks' inputs);
- a bitsandbytes paged optimizer keeps the states of its large tensors in CUDA managed memory, outside torch's
  allocator counters.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..spec.model import ModelSpec
from ..spec.scenario import Scenario, fast_replace
from .activations import ActivationCoefficients
from .head_gradient import HeadGradient, split_head

PAGED_MIN_NUMEL = 100_000
"""bitsandbytes' paged optimizers put a parameter's states in CUDA managed memory (cudaMallocManaged, outside torch's
caching allocator) only when it has at least this many elements; smaller ones get torch.zeros_like
(bitsandbytes 0.50.2 optim/optimizer.py get_state_buffer, functional.py get_paged)."""


def paged_state_params(scn: Scenario) -> int:
    """Trainable parameters in tensors of at least PAGED_MIN_NUMEL elements: those whose states a paged
    optimizer pages (every weight matrix of a full fine-tune; LoRA's A (r x in) and B (out x r) when that large)."""
    m, mix = scn.model, scn.mix
    if mix.method == "full":
        big = sum(lin.in_features * lin.out_features * lin.count * n for lin, n in m.linears()
                  if lin.in_features * lin.out_features >= PAGED_MIN_NUMEL)
        return big + m.embedding_params + m.lm_head_params + m.vision_params
    r = mix.lora_rank
    return sum(size * lin.count * n for lin, n in m.lora_targets(mix.lora_targets)
               for size in (r * lin.in_features, r * lin.out_features) if size >= PAGED_MIN_NUMEL)


def state_split(scn: Scenario) -> float:
    """Fraction of the model's parameters one GPU holds under tensor, pipeline and expert parallelism."""
    mix, m = scn.mix, scn.model
    mp = mix.tensor_parallel * mix.pipeline_parallel
    if mp == 1 and mix.expert_parallel == 1:
        return 1.0
    experts = _expert_params(m)
    total = m.total_params
    return ((total - experts) + experts / mix.expert_parallel) / total / mp


@lru_cache(maxsize=256)
def _expert_params(m: ModelSpec) -> int:
    """Parameters of the routed experts (what expert parallelism splits)."""
    return sum(lin.params * n for lin, n in m.linears() if lin.group == "experts")


def elementwise_saved_per_token(model: ModelSpec, mix, compiled: bool = False) -> float:
    """Bytes per token of what the elementwise ops between matmuls save and a policy recomputes. Per-op checkpointing
    (the matmuls' and attention's outputs kept): each attention block's fp32 norm copies and two of a gated MLP's
    intermediates. torch.compile (Inductor's partition of a compiled block, `compiled`): the norms' fp32 copies and
    normalized outputs less one h-wide tensor it keeps, and ONE of the MLP's intermediates (a trace of torchtune's
    own block, torch 2.13: eager 24 h + 8 f, compiled 14 h + 6 f bytes per token; benchmarks/compiled_layer_saved.py)."""
    a = model.arch
    c = 4 if mix.precision == "fp32" else 2
    out = 0.0
    for layer, n in model.layer_groups:
        if layer.mixer != "attention":
            continue
        count = 2 if not a.fact("parallel") else 1
        norms = 4 * a.hidden_size * count
        if compiled:  # the bf16 normalized outputs too, but one more h-wide tensor kept
            norms += c * a.hidden_size * (count - 1)
        gated = layer.ffn == "dense" and any(lin.role == "gate" for lin in layer.linears)
        mlp = (1 if compiled else 2) * c * a.intermediate_size if gated else 0
        out += (norms + mlp) * n
    return out


def _scale_acts(acts: ActivationCoefficients, factor: float) -> ActivationCoefficients:
    return fast_replace(acts, **{k: getattr(acts, k) * factor for k in (
        "saved_per_token", "saved_per_token_quadratic", "layer_per_token", "layer_per_token_quadratic",
        "layer_ffn_per_token", "forward_transient_per_token", "checkpoint_per_token", "checkpoint_layer_per_token")})


def activation_policy(acts: ActivationCoefficients, scn: Scenario) -> tuple[ActivationCoefficients, bool]:
    """(activation coefficients, whole blocks checkpointed?) under the mix's checkpointing policy, compile and
    parallel layout."""
    mix = scn.mix
    checkpointing = mix.gradient_checkpointing and mix.checkpointing == "full"
    if mix.gradient_checkpointing and mix.checkpointing == "selective":
        acts = replace(acts, saved_per_token_quadratic=0.0, layer_per_token_quadratic=0.0)
    per_op = mix.gradient_checkpointing and mix.checkpointing == "per-op"
    if per_op or mix.compile:
        drop = elementwise_saved_per_token(scn.model, mix, compiled=not per_op)
        acts = replace(acts, saved_per_token=max(acts.saved_per_token - drop, 0.0))
    if checkpointing and mix.checkpoint_every > 1:
        # 1 in N blocks keeps its input only; the others keep everything they save
        kept = acts.saved_per_token * (1 - 1 / mix.checkpoint_every)
        acts = replace(acts, checkpoint_per_token=acts.checkpoint_per_token / mix.checkpoint_every + kept,
                       checkpoint_layer_per_token=acts.layer_per_token)  # an uncheckpointed block saves it all
    tp, cp = mix.tensor_parallel, mix.context_parallel
    factor = (1.0 / tp if mix.sequence_parallel else 0.5 + 0.5 / tp) / cp
    if mix.pipeline_parallel > 1 and mix.virtual_stages > 1:
        factor *= 1 + (mix.pipeline_parallel - 1) / (mix.pipeline_parallel * mix.virtual_stages)
    if factor != 1.0:
        acts = _scale_acts(acts, factor)
    return acts, checkpointing


def split_states(v: dict, scn: Scenario, f: float, head: HeadGradient | None = None) -> dict | None:
    """The MemoryModel fields (`v`: by name) the layout splits or an optimizer fused into backward changes, with their
    new values (None: none changes). `f`: state_split(scn); `head`: split_head(v["head_grad"], f) if known."""
    mix = scn.mix
    # FSDP's CPU offload copies each sharded gradient to the host as backward makes it (torch's CPUOffloadPolicy;
    # FSDP1's CPUOffload(offload_params=True))
    host_grads = mix.fsdp is not None and mix.offload == "optimizer+params"
    if f == 1.0 and not mix.optimizer_in_backward and not host_grads:
        return None
    grads, grads_fwd = v["gradients"] * f, v["gradients_in_forward"] * f
    opt_transient = v["optimizer_transient"] * f
    if mix.optimizer_in_backward:
        layer = scn.model.largest_layer_params() / max(v["trainable_params"], 1)
        grads, grads_fwd = grads * min(layer * 2, 1.0), 0.0
        opt_transient *= min(layer * 2, 1.0)
    elif host_grads:  # two blocks' unsharded gradients: the one computed and the one being reduce-scattered
        layer = scn.model.largest_layer_params() / scn.model.total_params
        shards = scn.cluster.world_size // mix.model_parallel
        grads, grads_fwd = grads * shards * min(layer * 2, 1.0), 0.0
    return dict(weights=v["weights"] * f, gradients=grads, gradients_in_forward=grads_fwd,
                reserved_floor=v["reserved_floor"] * f, small_pool_step=v["small_pool_step"] * f,
                optimizer=v["optimizer"] * f, paged_optimizer=v["paged_optimizer"] * f,
                optimizer_transient=opt_transient, head_grad=split_head(v["head_grad"], f) if head is None else head,
                weight_transient=v["weight_transient"] * f, block_transient=v["block_transient"] * f,
                cpu_bytes=v["cpu_bytes"] * f, gradient_pool=min(v["gradient_pool"] * f, grads))
