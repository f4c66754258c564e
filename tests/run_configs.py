"""Experiment configs for runner tests: a config file's variant with `a__b=value` overrides."""

from ml_collections import ConfigDict


def smoke_config(module, variant="smoke", **overrides) -> ConfigDict:
  """`module.get_config(variant)` with progress bars off and `section__field=value` overrides
  applied, locked as the CLI locks it."""
  c = ConfigDict(module.get_config(variant).to_dict())
  c.progress = False
  for dotted, value in overrides.items():
    node = c
    *parents, leaf = dotted.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  c.lock()
  return c
