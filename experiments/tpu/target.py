"""What a TPU plan (`experiments.tpu.plan`) is made for, without a TPU or any weights.

`load_config` reads a config file with `--config.a.b=value` overrides. `model_config_for` gives
its model's `ModelConfig` without reading weights: the `--preset` given, else the random model's
preset, the bundled default's, a local HF directory's config.json, or the preset the path's base
name names ("-instruct" dropped). `topology_devices` lists a TPU topology's devices through
libtpu, and `make_mesh` lays the ('pop', 'model') mesh over them. `experiments.tpu.programs`
lowers the programs on that mesh.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from es_jax import models
from es_jax.devices import memory_plan
from es_jax.devices import sharding as sharding_lib
from es_jax.models import hf as hf_lib

# Where a config's model.path names a known checkpoint without a local copy.
_PRESET_ALIASES = {"qwen2.5-1.5b-instruct": "qwen2.5-1.5b", "qwen2.5-0.5b-instruct": "qwen2.5-0.5b"}


def load_config(spec: str, overrides: list[str]):
  """`get_config(variant)` of a config file, with `--config.a.b=value` overrides applied."""
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--config: no such file {path!r}")
  module_spec = importlib.util.spec_from_file_location("_plan_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(variant or None)
  for item in overrides:
    m = re.fullmatch(r"--config\.([\w.]+)=(.*)", item)
    if not m:
      raise ValueError(f"unknown argument {item!r}: overrides look like --config.es.rank=4")
    field, text = m.groups()
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    *parents, leaf = field.split(".")
    node = config
    try:
      for p in parents:
        node = node[p]
      if leaf not in node:
        raise KeyError(leaf)
      node[leaf] = value  # a locked ConfigDict still refuses a value of the wrong type
    except (KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"--config.{field}={text}: {type(e).__name__} {e}") from None
  return config


def model_config_for(model: Any, *, preset: str = "", dtype: str = "") -> models.ModelConfig:
  """The ModelConfig of config.model without loading weights (module docstring)."""
  source, path = model.get("source"), model.get("path") or ""
  if preset:
    cfg = models.get_config(preset)
  elif source == "random":
    cfg = models.get_config(model.get("preset") or "")
  elif source == "default":
    cfg = models.get_config("smollm2-135m").replace(dtype="float32")  # the GGUF loads as float32
  elif source == "hf" and os.path.isfile(os.path.join(path, "config.json")):
    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    cfg = hf_lib.config_from_hf(hf, os.path.join(path, "config.json"))
    cfg = cfg.replace(dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32"))
  else:
    name = os.path.basename(path.rstrip("/")).lower()
    name = _PRESET_ALIASES.get(name, name)
    if name not in models.PRESETS and name.endswith("-instruct"):
      name = name.removesuffix("-instruct")  # e.g. Llama-3.2-3B-Instruct -> llama-3.2-3b
    if name not in models.PRESETS:
      raise ValueError(
        f"config.model.path={path!r} (source {source!r}): no local config.json and no preset "
        f"named {name!r}; pass --preset (one of {sorted(models.PRESETS)})."
      )
    cfg = models.get_config(name)
  return cfg.replace(dtype=dtype) if dtype else cfg


def topology_devices(topology: str) -> list[Any]:
  """The devices of a TPU topology description (needs libtpu; works without a TPU)."""
  from jax.experimental import topologies

  memory_plan.chip_for(topology)  # a clear error for an unknown chip before libtpu's
  try:
    return list(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices)
  except Exception as e:  # noqa: BLE001 (libtpu's errors have no common type)
    raise ValueError(f"--topology={topology!r}: {str(e).splitlines()[0]}") from None


def make_mesh(devices, pop: int, model: int) -> Mesh:
  """A ('pop', 'model') Auto mesh over the first pop x model devices, in order.

  es_jax.devices.sharding.make_mesh's physical ordering needs one device per chip, which libtpu's v4
  topologies (one device per TensorCore) do not give; for planning the order does not matter.
  """
  if pop * model > len(devices):
    raise ValueError(f"config.mesh: pop={pop} x model={model} > {len(devices)} devices")
  grid = np.asarray(devices[: pop * model], dtype=object).reshape(pop, model)
  auto = jax.sharding.AxisType.Auto
  return Mesh(grid, sharding_lib.AXES, axis_types=(auto, auto))
