"""Real training steps: build the model, batches, meters, hooks, expert load, utilization, max-batch probing,
the profile sweep."""
