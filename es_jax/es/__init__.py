"""Evolution Strategies: noise, members, the population's evaluation, fitness shaping, the optax
transform (`gradient`) and the reference in-place arithmetic."""
