"""How many LM-head-sized weight gradients a step's backward holds at once (estimate/memory.py `head_gradient`).

Each case runs in a fresh process: a V x H head (256 MiB fp32) used by one matmul or by several (a chunked loss:
the head applied per chunk of tokens, as torchtune's chunked output does), tied to an embedding or not, with an
optimizer stepped in a post-accumulate-grad hook (torchtune's optimizer_in_bwd) or not. The peak is read from the
process's maximum resident set over the backward (glibc serves these buffers with mmap, so the resident set follows
the live tensors); no dispatch mode or hook holds a tensor, which would change what autograd may accumulate in place.

    python benchmarks/head_gradient_rss.py

Seen (torch 2.13.0 CPU), in head gradients above the start of backward:
- one matmul: 1 (with an untied embedding's own gradient at the end: 2);
- 2 or more chunks: 3 at the first accumulation: autograd sums the second chunk's gradient into the first one's out
  of place (a Linear weight's gradient is a transposed view, which input_buffer.cpp never accumulates into), then
  the later chunks in place;
- tied to the embedding, one matmul: 3 at the end (the embedding's gradient added out of place onto the head's
  view); chunked: the chunks' 3, the end adds the embedding's in place.
"""
from __future__ import annotations

import subprocess
import sys

V, H, T = 65536, 1024, 64


def case(tied: bool, chunks: int, hook: bool) -> float:
    """Head gradients (V x H fp32) alive at the peak of one backward, above what was alive when it started."""
    import resource

    import torch
    import torch.nn.functional as F

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    torch.manual_seed(0)
    emb = torch.nn.Parameter(torch.randn(V, H) * 0.01)
    head = emb if tied else torch.nn.Parameter(torch.randn(V, H) * 0.01)
    emb.requires_grad_(tied)  # an untied embedding stays frozen: only the head's gradients count
    block = torch.nn.Parameter(torch.randn(H, H) * 0.01)
    if hook:
        def step(p: torch.Tensor) -> None:
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None
        for p in {id(q): q for q in (emb, head, block) if q.requires_grad}.values():
            p.register_post_accumulate_grad_hook(step)
    x = torch.randint(0, V, (1, T))
    h = torch.tanh(F.embedding(x, emb) @ block)
    loss = sum(F.linear(c, head).logsumexp(-1).sum() for c in h.chunk(chunks, 1))
    start = rss_mib()
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (peak - start) / (V * H * 4 / 2**20)


def main() -> None:
    if len(sys.argv) == 4:
        tied, chunks, hook = (int(a) for a in sys.argv[1:])
        print(f"{case(bool(tied), chunks, bool(hook)):.2f}")
        return
    print("tied  chunks  optimizer in backward  head gradients alive at the peak")
    for tied in (0, 1):
        for chunks in (1, 4):
            for hook in (0, 1):
                out = subprocess.run([sys.executable, __file__, str(tied), str(chunks), str(hook)],
                                     capture_output=True, text=True, check=True).stdout.split()[-1]
                print(f"{bool(tied)!s:5} {chunks:6d}  {bool(hook)!s:21}  {out}")


if __name__ == "__main__":
    main()
