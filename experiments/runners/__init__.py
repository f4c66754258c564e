"""A run from its config to its final evaluation: the ES, GRPO and sequential runners, the loop, the
run's context, data and guards."""
