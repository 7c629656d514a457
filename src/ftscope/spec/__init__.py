"""Inputs: model, hardware, optimization mix, workload, and the scenario that ties them together."""
