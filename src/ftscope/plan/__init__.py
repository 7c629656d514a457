"""Search: solvers for the largest batch / context that fits, and the plan over GPUs and counts."""
