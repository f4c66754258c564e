"""Held-out evaluation: tasks, problems, the sampler's layout, records and tables, resuming."""
