"""The two studies ftscope grew from, as small recipes: the Singh et al. optimization study (from the estimator)
and the IISWC MoE sparse-vs-dense fine-tuning study (real runs)."""
