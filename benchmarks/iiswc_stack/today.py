"""The same step under today's stack (the worktree's .venv: transformers 5.x, PEFT, bitsandbytes >= 0.45).

The model is built by ftscope's own `build_model` from the IISWC example scenario (QLoRA r16 on w1, w2, w3 and
gate; bitsandbytes Linear4bit on every nn.Linear but lm_head; non-reentrant gradient checkpointing, as
LLaMA-Factory 0.5 sets it), shrunk like the 2024 run. The step is what the HF Trainer does: forward under CPU
bf16 autocast with labels and the router aux loss on (output_router_logits, as the study's workflow.py sets),
then backward. Padding: equal-length samples, so the collator adds none.
"""
from __future__ import annotations

import sys
from typing import Any

from fixtures import VOCAB
from tracking import REPO, LabelledTracker, ctx_held_storages


def build(layers: int, hidden: int, top_k: int, quantize: bool) -> Any:
    sys.path.insert(0, str(REPO / "src"))
    from ftscope.measure.runtime.build import build_model
    from ftscope.spec.scenario import load_scenario

    overrides = [f"mix.experts_top_k={top_k}"] + ([] if quantize else ["mix.method=lora"])
    scn = load_scenario(REPO / "examples" / "iiswc-mixtral-qlora.yaml", overrides)
    model, info = build_model(scn, device="cpu", shrink={"layers": layers, "hidden": hidden, "vocab": VOCAB})
    return model, info


def run_today_step(layers: int, hidden: int, top_k: int, batch: int, seq: int, quantize: bool = True,
                   router_aux_loss: bool = True) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model, info = build(layers, hidden, top_k, quantize)
    model.config.output_router_logits = router_aux_loss
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.output_router_logits = router_aux_loss
    ids = torch.randint(5, VOCAB, (batch, seq))
    labels = ids.clone()
    labels[:, : seq // 2] = -100  # the prompt half is masked, as llmtuner's supervised preprocessing does
    result: dict[str, Any] = {"batch": batch, "seq": seq, "notes": info.notes}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-5)
    tracker = LabelledTracker(model, opt)
    base_bytes = tracker.live_bytes
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
        loss = out["loss"]
        result["forward_end_bytes"] = tracker.live_bytes - base_bytes
        result["live"] = tracker.live_created()
        result["ctx_held"] = ctx_held_storages(loss)
        del out  # the Trainer's compute_loss returns the loss only
        loss.backward()
        result["backward_peak_bytes"] = tracker.peak_bytes - base_bytes
    tracker.close()
    return result


def versions() -> dict[str, str]:
    import importlib.metadata as md

    return {n: md.version(n) for n in ["torch", "transformers", "peft", "accelerate", "bitsandbytes"]}
