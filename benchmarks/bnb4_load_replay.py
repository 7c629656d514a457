"""The HF 4-bit blog's May-2023 QLoRA run on a T4, replayed through the caching-allocator model from model load to
the third training step: does what loading leaves cached explain the 13B out-of-memory row?

Why: hf2023_qlora_step_trace.py traces one step of the real transformers 4.30.2 Llama and peaks 4 GiB under the
T4 on the 13B NF4 + checkpointing + 1,024-token row that ran out of memory. That trace starts from an empty
allocator with the weights packed together. The real run first loads the fp16 checkpoint and quantizes it on the
GPU, one matrix at a time; the 4-bit results carve into the blocks the fp16 matrices left cached.

Load, from the sources (no fitted number):
- transformers 4.30.2 _load_state_dict_into_meta_model, per checkpoint key in file order: a 4-bit Linear's weight
  through utils/bitsandbytes.py set_module_quantized_tensor_to_device -> Params4bit(...).to(device); anything
  else through accelerate's set_module_tensor_to_device (an fp16 copy on the GPU).
- bitsandbytes 0.39 (675baa7) Params4bit.cuda: w = data.half().cuda(); quantize_4bit(w): absmax fp32 per 64,
  out uint8 (n+1)//2; with compress_statistics (nested): offset = absmax.mean(), quantize_blockwise(absmax, 256):
  absmax2 fp32 per 256, out2 uint8 per absmax, then absmax dropped; w dropped on return.
- decapoda-research/llama-*-hf checkpoint order (the early convert_llama_weights_to_hf.py: one file per layer,
  q, k, v, o, gate, down, up, the two norms, rotary inv_freq; then embed_tokens, norm, lm_head).
- PEFT prepare_model_for_kbit_training (3714aa2 utils/other.py): every fp16 parameter cast to fp32 in
  model.parameters() order (embeddings, norms, final norm, LM head), the fp16 copy dropped.
- LoRA A/B (fp32) on the GPU, then the traced step (hf2023_qlora_step_trace.step's allocation stream) three times,
  with torch's OOM retry: when a new segment would pass the capacity, every segment with no live block is released
  (release_cached_blocks) and the request retried; still over is an out-of-memory.

    python benchmarks/bnb4_load_replay.py /tmp/tf430/pkg [capacity GiB, default ftscope's T4 14.5]

Seen (r8 on q, v; capacity 14.5 GiB): after load 8.71 / 8.28 GiB reserved, 7.94 / 7.37 allocated, 0.02 / 0.17 GiB
free inside live segments (13B without / with nested quantization; the q,k,v,o,gate,up,down order gave the same
within 0.02 GiB in an earlier replay of the load alone). Then the three steps fit: reserved peaks 10.21 / 9.68 GiB
(13B, 1,024 tokens), 8.96 (13B, 512), 6.09 (7B, 1,024), no retry needed. So the load's cache is not the 13B row's
missing 4 GiB: the step reuses what the load left.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from hf2023_qlora_step_trace import SIZES, import_transformers_430, trace  # noqa: E402

from ftscope.estimate.caching_allocator import CachingAllocator  # noqa: E402

GIB = 2**30


class OutOfMemory(Exception):
    pass


class CappedAllocator(CachingAllocator):
    """The caching-allocator model with a capacity and torch's retry: release every free segment, then fail."""

    def __init__(self, capacity: float):
        super().__init__()
        self.capacity = capacity
        self.released = 0

    def malloc(self, key, nbytes):
        before = self.reserved
        super().malloc(key, nbytes)
        if self.reserved > before and self.reserved > self.capacity:
            self.empty_cache()
            self.released += 1
            if self.reserved > self.capacity:
                raise OutOfMemory(f"{self.reserved / GIB:.2f} GiB reserved, {self.allocated / GIB:.2f} allocated")
            self.peak_reserved = self.reserved


def load(alloc: CachingAllocator, size: str, nested: bool, r: int) -> list:
    """Replay the load and k-bit preparation; returns the live keys (the model's tensors on the GPU)."""
    cfg = SIZES[size]
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], 32000
    keys, live = iter(range(10**9)), []

    def m(nbytes):
        k = next(keys)
        alloc.malloc(k, max(int(nbytes), 1))
        return k

    def quantize(n):
        w = m(2 * n)
        absmax = m(4 * -(-n // 64))
        out = m((n + 1) // 2)
        kept = [out]
        if nested:
            blocks = -(-n // 64)
            offset = m(4)
            kept += [offset, m(4 * -(-blocks // 256)), m(blocks)]
            alloc.free(absmax)
        else:
            kept.append(absmax)
        alloc.free(w)
        return kept

    fp16 = {}
    for _ in range(layers):
        for shape in ((h, h),) * 4 + ((inter, h), (h, inter), (inter, h)):
            live += quantize(shape[0] * shape[1])
        for name in ("in_norm", "post_norm"):
            fp16.setdefault(name, []).append(m(2 * h))
        live.append(m(4 * 64))  # rotary inv_freq (fp32 buffer)
    emb, norm, head = m(2 * vocab * h), m(2 * h), m(2 * vocab * h)
    # prepare_model_for_kbit_training: parameters() order is embed, per layer (norms), final norm, lm_head
    order = [emb] + [k for pair in zip(fp16["in_norm"], fp16["post_norm"]) for k in pair] + [norm, head]
    for k in order:
        nbytes = alloc._live[k].size
        new = m(2 * nbytes)
        alloc.free(k)
        live.append(new)
    for _ in range(layers):  # LoRA A (r x h) and B (h x r) on q_proj and v_proj, fp32
        live += [m(4 * r * h) for _ in range(4)]
    return live


def run(classes, size, seq, gc, nested, r, capacity):
    from ftscope.measure.trace.allocator import replay_steps
    alloc = CappedAllocator(capacity)
    load(alloc, size, nested, r)
    after_load = (alloc.reserved / GIB, alloc.allocated / GIB, alloc.pinned_free() / GIB)
    recs = trace(size, seq, gc, 1, r, 0.0, nested, classes).recs
    try:
        replay_steps(recs, allocator=alloc)
        outcome = f"fits, reserved peak {alloc.peak_reserved / GIB:.2f} GiB"
    except OutOfMemory as e:
        outcome = f"OOM ({e})"
    return after_load, outcome


ROWS = [("13b", 1024, 1, 0), ("13b", 1024, 1, 1), ("13b", 512, 1, 0), ("7b", 1024, 1, 0)]


def main():
    classes = import_transformers_430(sys.argv[1])
    capacity = float(sys.argv[2]) * GIB if len(sys.argv) > 2 else 14.5 * GIB
    for size, seq, gc, nested in ROWS:
        (res, al, pinned), outcome = run(classes, size, seq, gc, nested, 8, capacity)
        print(f"{size} seq {seq} gc {gc} nested {nested}: after load {res:.2f} GiB reserved, {al:.2f} allocated, "
              f"{pinned:.2f} pinned free; step: {outcome}", flush=True)


if __name__ == "__main__":
    main()
