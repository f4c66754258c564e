"""TPU planning on any machine: compile a config's programs for a topology, the memory check and the
run's cost."""
