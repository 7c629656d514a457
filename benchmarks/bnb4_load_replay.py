"""transformers 4.30 + bitsandbytes 0.39 loading a 13B Llama in 4-bit on one GPU, through the caching-allocator
model: per weight matrix (checkpoint order) Params4bit.cuda: the fp16 weight moved to the GPU (2 n), quantize_4bit's
packed data (n/2) and fp32 absmax (n/64 x 4), with nested quantization the absmax quantized to uint8 and the fp32
absmax freed; the fp16 weight freed. Non-4-bit weights (embedding, norms, LM head) loaded in fp16, then cast to
fp32 by prepare_model_for_int8_training (new tensor, old freed).

Why: the HF 4-bit blog's 13B NF4 row at 1,024 tokens ran out of memory on a 16 GB T4 without nested quantization
and fit with it, where ftscope predicts 9.6 GiB for both; a load that left the card fragmented would explain a
knife-edge outcome. Seen: 7.92 / 7.34 GiB allocated, 8.69 / 8.25 GiB reserved (without / with nested
quantization) in either checkpoint order: under 1 GiB cached, so not that.

    python benchmarks/bnb4_load_replay.py
"""
import itertools, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "src"))
from ftscope.estimate.caching_allocator import CachingAllocator
G = 2**30
h, inter, V, L = 5120, 13824, 32000, 40
def run(nested, order):
    a = CachingAllocator(); k = itertools.count(); live = []
    def m(nb):
        key = next(k); a.malloc(key, max(int(nb), 1)); return key
    emb = m(2 * V * h)
    for _ in range(L):
        for (i, o) in order:
            n = i * o
            W = m(2 * n); out = m(n / 2); absmax = m(4 * n / 64)
            if nested:
                q = m(n / 64); s2 = m(4 * n / 64 / 256); a.free(absmax); live += [out, q, s2]
            else:
                live += [out, absmax]
            a.free(W)
        live += [m(2 * h), m(2 * h)]
    norm = m(2 * h); head = m(2 * V * h)
    # prepare_model_for_int8_training: non-4-bit parameters cast to fp32
    for key, nb in ((emb, 2 * V * h), (head, 2 * V * h), (norm, 2 * h)):
        new = m(2 * nb); a.free(key)
    return a
orders = {"q,k,v,o,gate,up,down": [(h, h)] * 4 + [(h, inter), (h, inter), (inter, h)],
          "q,k,v,o,gate,down,up": [(h, h)] * 4 + [(h, inter), (inter, h), (h, inter)]}
for name, order in orders.items():
    for nested in (False, True):
        a = run(nested, order)
        print(f"{name:22s} nested={nested!s:5}: allocated {a.allocated/G:5.2f} GiB, reserved {a.reserved/G:5.2f} GiB, segments {a.segments}")
