"""Fake-tensor trace of one training step of the real implementation: the tracer, FLOP formulas, layer
attribution, the storage recorder and the CUDA caching-allocator model its allocations replay through."""
