"""gpusv: a single-node multi-GPU job supervisor."""
