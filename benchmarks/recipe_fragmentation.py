"""A framework's own fragmentation fraction: trace its checkpointed step and replay it through the allocator model.

`Recipe.allocator_fragmentation_checkpointed` comes from here. The step is traced at full size under fake tensors
(`ftscope trace`, one GPU, no sharding: FSDP's gathered units sit on their own stream's pool, which the estimator
adds apart) with the recipe's loss code: a recipe with `loss_upcast_in_forward` and `loss_shift_copy` runs
transformers 4.3x-4.45's Llama loss (`logits = logits.float()`, `logits[..., :-1, :].contiguous()`, CrossEntropyLoss),
patched over transformers 5's, and `loss_logits_held` keeps the output logits until the step ends (fsdp_qlora keeps
`output` until after the optimizer step). The traced allocations are replayed for three steps through
estimate/caching_allocator.py (within 1 % of the H200's max_memory_reserved on 66 profile points), and the
fraction is (peak reserved - peak allocated) / the activations at the peak. `pinned` is the free space inside segments
that still hold a tensor at the last step's peak of allocated bytes, over the same activations: what releasing the
cache (torch's retry of a failed cudaMalloc) cannot return (AllocatorModel.pinned).

Shapes below 4 x 2048 tokens are left out of the median: there the allocator's overhead is a few hundred MiB of
fixed segments, not a share of the activations (Llama-2-7B QLoRA at 1 x 2048: 0.61).

Run:  .venv/bin/python benchmarks/recipe_fragmentation.py      # fsdp-qlora: 0.30 (0.295-0.325 over its 7 shapes)
      .venv/bin/python benchmarks/recipe_fragmentation.py --framework peft-sft-2024 --model meta-llama/Llama-2-70b-hf \
          --rank 8 --min-tokens 4096 --shapes qlora:2:2048:bf16-mixed,lora:8:2048
(shapes: method:batch:seq[:precision]; one to a few minutes per shape on 2 CPU cores; needs the test extras:
torch, transformers, peft, bitsandbytes)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

GIB = 2**30
MODEL = "meta-llama/Llama-2-7b-hf"
SHAPES = "lora:4:2048,lora:6:2048,lora:10:2048,qlora:4:2048,qlora:8:2048,qlora:10:2048,qlora:12:2048"
"""fsdp_qlora's benchmark shapes (Llama-2-7B, LoRA r64 on every linear, 2048 tokens), batch 4 and up."""
MIN_TOKENS = 4 * 2048


def patch_loss(recipe, held: list) -> None:
    """Run transformers 4.3x's Llama loss in place of transformers 5's (when the recipe says it ran that one)."""
    import torch
    import transformers.models.llama.modeling_llama as llama

    if not (recipe.loss_upcast_in_forward and recipe.loss_shift_copy):
        return

    class Output:
        def __init__(self, loss, logits):
            self.loss, self.logits = loss, logits

    def forward(self, input_ids=None, labels=None, use_cache=False, **_):
        hidden = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        logits = self.lm_head(hidden).float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = torch.nn.functional.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        if recipe.loss_logits_held:
            held.append(logits)  # alive until the step ends, as the training loop keeps `output`
        return Output(loss, logits)

    llama.LlamaForCausalLM.forward = forward


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", default="fsdp-qlora")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--shapes", default=SHAPES, help="method:batch:seq[:precision],...")
    ap.add_argument("--rank", type=int, default=64, help="LoRA rank (on every linear)")
    ap.add_argument("--min-tokens", type=int, default=MIN_TOKENS, help="smallest batch x seq in the median")
    args = ap.parse_args()

    from ftscope.measure.trace.allocator import replay_steps
    from ftscope.measure.trace.tracer import trace
    from ftscope.spec.recipe import load_recipe
    from ftscope.spec.scenario import scenario_from_dict

    recipe = load_recipe(args.framework)
    held: list = []
    patch_loss(recipe, held)
    fractions = []
    for shape in args.shapes.split(","):
        method, batch, seq, *precision = shape.split(":")
        scn = scenario_from_dict({
            "model": args.model, "framework": args.framework, "hardware": {"gpu": "h200"},
            "mix": {"method": method, "lora_rank": args.rank, "lora_targets": "all-linear", "gradient_checkpointing": True,
                    "attention": "sdpa", "precision": precision[0] if precision else "bf16", "optimizer": "adamw",
                    "fsdp": "none", "zero_stage": 0},
            "workload": {"micro_batch_size": int(batch), "seq_len": int(seq)}})
        result = trace(scn)
        held.clear()
        at_peak = [0, 0]  # the last step's peak of allocated bytes and the pinned free bytes then

        def watch(a, step, last=2):
            if step == last and a.allocated >= at_peak[0]:
                at_peak[:] = [a.allocated, a.pinned_free()]

        alloc = replay_steps(result.recs, steps=3, watch=watch)
        churn = result.categories["activations"] + result.categories["temporary"]
        frac, pinned = (alloc.peak_reserved - alloc.peak_allocated) / churn, at_peak[1] / churn
        if int(batch) * int(seq) >= args.min_tokens:
            fractions.append((frac, pinned))
        print(f"{shape:16s} allocated {alloc.peak_allocated / GIB:6.2f} GiB  reserved {alloc.peak_reserved / GIB:6.2f}  "
              f"activations {churn / GIB:6.2f}  fraction {frac:.3f}  pinned {pinned:.3f}", flush=True)
    if fractions:
        print(f"{args.framework}: fragmentation of the checkpointed step {statistics.median(f for f, _ in fractions):.2f}, "
              f"pinned {statistics.median(p for _, p in fractions):.2f} "
              f"(medians of {len(fractions)} shapes of at least {args.min_tokens} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
