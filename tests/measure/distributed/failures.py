"""Step hooks the distributed tests install (`profile_distributed(step_hook=f"{__file__}:NAME")`): every rank
calls the hook before each training step with (rank, optimizer steps done), so a test can make one rank fail."""
from __future__ import annotations

import time


def raise_on_rank_1(rank: int, steps_done: int) -> None:
    """Rank 1 raises once it has taken one step."""
    if rank == 1 and steps_done >= 1:
        raise RuntimeError(f"injected failure on rank {rank} after {steps_done} steps")


def hang_on_rank_1(rank: int, steps_done: int) -> None:
    """Rank 1 stops answering (its peers wait in a collective) once it has taken one step."""
    if rank == 1 and steps_done >= 1:
        while True:
            time.sleep(60)
