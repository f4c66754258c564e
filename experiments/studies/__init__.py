"""Studies assembled from runs: the demo, the fair ES-vs-GRPO studies, calibration, diversity, the
population sweep, sparsity."""
