"""One QLoRA training step of the HF 4-bit blog's May-2023 stack, traced on fake tensors with the real transformers
4.30.2 Llama code: allocated peak, and reserved through the caching-allocator model (3 steps replayed).

Why: the blog's T4 table has 13B NF4, checkpointing, fp16, 1,024 tokens out of memory (and fit with nested
quantization): a real peak near the T4's ~14.5 GiB, where ftscope predicts 9.6 GiB. This asks whether anything
in transformers 4.30's own step (eager attention with its fp32 mask and torch.max, reentrant checkpointing, the
fp32 residual stream that k-bit preparation leaves, the loss) is missing from the estimate.

Real code: transformers 4.30.2's LlamaForCausalLM, its enable_input_require_grads and gradient_checkpointing_enable
(what prepare_model_for_kbit_training calls, peft 3714aa2 utils/other.py 36-69). Stand-ins with the same tensors
and dtypes, written from the sources: bitsandbytes 0.39 Linear4bit.forward (nn/modules.py 207-223 at 675baa7:
x.to(compute_dtype), out.to(input dtype)) and MatMul4Bit (autograd/_functions.py 491-546: a dequantized
compute-dtype weight per call, A kept as ctx.tensors); PEFT 3714aa2 lora.Linear4bit.forward (tuners/lora.py
767-791). Non-4-bit weights in fp32 (the k-bit preparation). Autocast is CPU autocast (fake CPU tensors), fp16.

    pip download --no-deps transformers==4.30.2 -d /tmp/tf430 && unzip -q /tmp/tf430/*.whl -d /tmp/tf430/pkg
    python benchmarks/hf2023_qlora_step_trace.py /tmp/tf430/pkg

Seen (GiB allocated / reserved; r8 on q,v, no dropout, fp16 autocast unless said; ftscope's estimate, reserved):
  13B gc 1024 tokens: 9.69 / 10.35 without nested quantization, 9.14 / 9.63 with; r64 + dropout 0.1: 9.91 / 10.60
                      (ftscope 9.99, counting nested quantization for both)
  13B gc  512 tokens: 8.86 / 9.40 (ftscope 8.86)       7B gc 1024, no autocast: 5.69 / 5.96 (ftscope 6.01)
  7B no gc  512: 11.61 / 12.02, no autocast 11.23 / 11.65 (ftscope 8.88)
  7B no gc 1024, no autocast: 22.01 / 22.64 (ftscope 16.66)      13B no gc 512: 19.00 / 19.55 (ftscope 14.60)
The T4 outcomes (usable ~14.5 GiB) agree with every row but the 13B gc 1,024-token one, which ran out of memory
4 GiB above this step. Without checkpointing the step is 25-30 % above the estimate; by a count of the saved
tensors, three facts of the stack make the difference: transformers 4.30's torch.max keeps the fp32 masked scores
(the mask is in the fp32 embeddings' dtype), bitsandbytes returns fp32 on the fp32 stream (gate, act and up are
fp32), and its MatMul4Bit keeps a compute-dtype copy of every 4-bit linear's input that needs grad.
"""
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
ROWS = [("13b", 1024, 1, 1, 8, 0.0, 0), ("13b", 1024, 1, 1, 8, 0.0, 1), ("13b", 1024, 1, 1, 64, 0.1, 0),
        ("13b", 512, 1, 1, 8, 0.0, 0), ("7b", 1024, 1, 0, 8, 0.0, 0), ("7b", 512, 0, 1, 8, 0.0, 0),
        ("7b", 512, 0, 0, 8, 0.0, 0), ("7b", 1024, 0, 0, 8, 0.0, 0), ("13b", 512, 0, 1, 8, 0.0, 0)]
SIZES = {"7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32),
         "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40)}


def import_transformers_430(path):
    """Import the unpacked 4.30.2 wheel: its import-time version check and `requests` (hub code, unused) stubbed."""
    sys.path.insert(0, str(path))
    if "requests" not in sys.modules:
        req, exc = types.ModuleType("requests"), types.ModuleType("requests.exceptions")
        exc.HTTPError = exc.ConnectionError = exc.Timeout = req.HTTPError = OSError
        req.__path__, req.exceptions = [], exc
        sys.modules.update({"requests": req, "requests.exceptions": exc})
    check = types.ModuleType("transformers.dependency_versions_check")
    check.dep_version_check = lambda pkg, hint=None: None
    sys.modules["transformers.dependency_versions_check"] = check
    import transformers
    assert transformers.__version__ == "4.30.2", transformers.__version__
    from transformers.models.llama.modeling_llama import LlamaConfig, LlamaForCausalLM
    return LlamaConfig, LlamaForCausalLM


def modules(torch):
    nn = torch.nn

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx, A, B, shape):
            out = nn.functional.linear(A, torch.empty(shape, dtype=A.dtype))  # dequantize_4bit(B).to(A.dtype)
            ctx.shape, ctx.tensors = shape, (A, B)
            return out

        @staticmethod
        def backward(ctx, g):
            return torch.matmul(g, torch.empty(ctx.shape, dtype=g.dtype)), None, None

    class Linear4bit(nn.Module):
        def __init__(self, lin, nested):
            super().__init__()
            n, self.shape = lin.weight.numel(), tuple(lin.weight.shape)
            self.register_buffer("packed", torch.empty(n // 2, dtype=torch.uint8))
            self.register_buffer("absmax", torch.empty(n // 64, dtype=torch.uint8 if nested else torch.float32))

        def forward(self, x):
            return MatMul4Bit.apply(x.to(torch.float16), self.packed, self.shape).to(x.dtype)

    class Lora4bit(Linear4bit):
        def __init__(self, lin, nested, r, dropout):
            super().__init__(lin, nested)
            self.lora_A = nn.Linear(self.shape[1], r, bias=False)
            self.lora_B = nn.Linear(r, self.shape[0], bias=False)
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

        def forward(self, x):
            result = super().forward(x).clone()
            if not torch.is_autocast_enabled("cpu"):
                out = self.lora_B(self.lora_A(self.drop(x.to(torch.float32)))).to(result.dtype) * 2.0
            else:
                out = self.lora_B(self.lora_A(self.drop(x))) * 2.0
            result += out
            return result

    return Linear4bit, Lora4bit


def step(size, seq, gc, amp, r, dropout, nested, classes):
    """(allocated peak, reserved peak through the caching-allocator model, 3 steps) in GiB."""
    from ftscope.measure.trace.allocator import replay_steps
    rec = trace(size, seq, gc, amp, r, dropout, nested, classes)
    peak = max(p[0] for p in rec.peaks.values())
    return peak / 2**30, replay_steps(rec.recs).peak_reserved / 2**30


def trace(size, seq, gc, amp, r, dropout, nested, classes):
    """The Recorder of one traced step (its `recs`: every storage with its creation and free event)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from ftscope.measure.trace.layers import LayerContext
    from ftscope.measure.trace.recorder import Recorder
    LlamaConfig, LlamaForCausalLM = classes
    Linear4bit, Lora4bit = modules(torch)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=32000, use_cache=False, **SIZES[size]))
        for layer in model.model.layers:
            for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                  (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
                for nm in names:
                    lin = getattr(parent, nm)
                    setattr(parent, nm, Lora4bit(lin, nested, r, dropout) if nm in ("q_proj", "v_proj")
                            else Linear4bit(lin, nested))
        for n, p in model.named_parameters():
            p.requires_grad = "lora_" in n
        if gc:
            model.enable_input_require_grads()
            model.gradient_checkpointing_enable()
        model.train()
        rec = Recorder(None, None, LayerContext(model))
        ids = torch.randint(0, 32000, (1, seq))
        with rec:
            rec.register_weights(list(model.parameters()) + list(model.buffers()))
            rec.set_phase("forward")
            with torch.autocast("cpu", dtype=torch.float16, enabled=bool(amp)):
                loss = model(input_ids=ids, attention_mask=torch.ones(1, seq, dtype=torch.long), labels=ids).loss
            rec.set_phase("backward")
            loss.backward()
            del loss
    return rec


def main():
    classes = import_transformers_430(sys.argv[1])
    for row in ROWS:
        alloc, reserved = step(*row, classes)
        size, seq, gc, amp, r, dropout, nested = row
        print(f"{size} seq {seq} gc {gc} autocast {amp} r{r} dropout {dropout} nested {nested}: "
              f"{alloc:.2f} GiB allocated, {reserved:.2f} GiB reserved")


if __name__ == "__main__":
    main()
