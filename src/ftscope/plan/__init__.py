"""Search over mixes x GPUs x counts (plan, recommend) and the launch configs of the winner (emit)."""
