"""Where a program sits on chips: the ('pop', 'model') mesh and shardings, the per-chip memory
estimates."""
