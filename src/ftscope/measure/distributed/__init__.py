"""Several ranks: the torchrun launcher, the rank worker, the engines it wraps the model in (DeepSpeed ZeRO,
FSDP2, DDP) and what each rank measures."""
