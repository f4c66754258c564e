"""Device mesh, multi-host start-up and shardings for ES and GRPO.

One mesh with two axes serves every run:

* ``'pop'``: population members (ES) or the prompt batch (GRPO, inference) are split over it;
  nothing but a few floats per member crosses it during an ES evaluation.
* ``'model'``: large parameter matrices are split over it when a model does not fit (or is slow)
  on one chip; size 1 (everything replicated) is the default.

Both axes are ``AxisType.Auto`` (jax 0.10's ``jax.make_mesh`` defaults to Explicit axes, under
which indexing a sharded output raises ``ShardingTypeError``).

On a multi-host TPU pod call ``initialize_distributed()`` first thing (before any other JAX
call); the mesh then spans every chip of every host, ordered so that the ``'model'`` axis stays
inside a host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from es_jax import _checks

AXES = ("pop", "model")

# Environment variables that announce a multi-process launch. jax.distributed.initialize()
# discovers the coordinator itself from them (TPU metadata, SLURM, Open MPI, or explicit).
_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")
# An explicit launch (e.g. several processes on one machine or hand-started hosts) names the
# process count and this process's index; jax.distributed.initialize() reads neither itself.
_EXPLICIT_VARS = {"num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}


def make_mesh(
  pop: int | None = None, model: int = 1, *, devices: Sequence[Any] | None = None
) -> Mesh:
  """A ``('pop', 'model')`` mesh with Auto axis types.

  Args:
    pop: size of the population/batch axis. Default: all devices not used by ``model``.
    model: size of the parameter-sharding axis (1 = parameters replicated).
    devices: devices to use (default ``jax.devices()``, every chip of every host). With fewer
      devices in the mesh than given, the first ``pop * model`` are used (e.g. ``pop=1`` for a
      single-device reference run).

  Returns:
    A ``jax.sharding.Mesh`` of shape ``(pop, model)``.
  """
  devices = list(jax.devices() if devices is None else devices)
  _checks.positive_int(model, "make_mesh: model", static=False)
  if len(devices) % model and pop is None:
    raise ValueError(
      f"make_mesh: model={model} does not divide the {len(devices)} devices: pass pop= "
      "explicitly or choose a model axis size that divides the device count."
    )
  if pop is None:
    pop = len(devices) // model
  _checks.positive_int(pop, "make_mesh: pop", static=False)
  if pop * model > len(devices):
    raise ValueError(
      f"make_mesh: pop={pop} x model={model} = {pop * model} devices, but only "
      f"{len(devices)} are available: shrink pop or model."
    )
  auto = jax.sharding.AxisType.Auto
  return jax.make_mesh((pop, model), AXES, axis_types=(auto, auto), devices=devices[: pop * model])


def initialize_distributed(**kwargs: Any) -> bool:
  """Joins a multi-host run (``jax.distributed.initialize``); a no-op on one host.

  Initialises when the environment announces several processes: a coordinator address
  (``JAX_COORDINATOR_ADDRESS``), a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` with more than
  one host, or ``MEGASCALE_COORDINATOR_ADDRESS``), or a SLURM / Open MPI launch with more than one
  task. A launch by hand (no cluster to detect) sets ``JAX_COORDINATOR_ADDRESS`` (host:port of
  process 0), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` in every process. Call it before any
  other JAX call.

  Args:
    **kwargs: passed to ``jax.distributed.initialize`` (coordinator_address, num_processes, ...);
      passing any forces initialisation.

  Returns:
    True if this call initialised the distributed runtime, False otherwise (single host, or
    already initialised).
  """
  if jax.distributed.is_initialized():
    return False
  if not kwargs and not _multi_process_env(os.environ):
    return False
  jax.distributed.initialize(**{**explicit_launch(os.environ), **kwargs})
  return True


def explicit_launch(env: dict[str, str]) -> dict[str, int]:
  """``num_processes`` / ``process_id`` from ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``.

  Raises:
    ValueError: a variable is set but not a non-negative integer (the message names it).
  """
  out = {}
  for name, var in _EXPLICIT_VARS.items():
    value = env.get(var, "").strip()
    if not value:
      continue
    if not value.isdigit():
      raise ValueError(f"{var}={value!r}: need a non-negative integer.")
    out[name] = int(value)
  return out


def _multi_process_env(env: dict[str, str]) -> bool:
  if any(env.get(v) for v in _COORDINATOR_VARS):
    return True
  if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return True
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  if len(hosts) > 1:
    return True
  for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    try:
      if int(env.get(var, "1")) > 1:
        return True
    except ValueError:
      pass
  return False


def leaf_spec(shape: Sequence[int], model: int, *, min_size: int = 2**18) -> PartitionSpec:
  """Partition spec of one parameter: replicated, or one matrix axis split over ``'model'``.

  Matrices (``ndim >= 2``; the last two dims, so layer-stacked ``[L, m, n]`` weights keep ``L``
  whole) with at least ``min_size`` entries are split over the larger of their two matrix dims
  that ``model`` divides; everything else (norms, biases, small matrices) is replicated.
  """
  if model == 1 or len(shape) < 2 or int(np.prod(shape)) < min_size:
    return PartitionSpec()
  for axis in sorted((len(shape) - 2, len(shape) - 1), key=lambda a: -shape[a]):
    if shape[axis] % model == 0:
      spec = [None] * len(shape)
      spec[axis] = "model"
      return PartitionSpec(*spec)
  return PartitionSpec()


def param_shardings(params: Any, mesh: Mesh, *, min_size: int = 2**18) -> Any:
  """``NamedSharding`` for every leaf of ``params`` (see ``leaf_spec``).

  Replicated over ``'pop'`` always; large matrices split over ``'model'`` when that axis has
  size > 1.

  Args:
    params: parameter pytree (arrays or ``jax.ShapeDtypeStruct``).
    mesh: a mesh from ``make_mesh``.
    min_size: matrices with fewer entries stay replicated (splitting them costs more in
      communication than it saves).

  Returns:
    A pytree of ``NamedSharding`` with the structure of ``params``.
  """
  model = mesh.shape["model"]
  return jax.tree.map(
    lambda x: NamedSharding(mesh, leaf_spec(np.shape(x), model, min_size=min_size)), params
  )


def shard_params(params: Any, mesh: Mesh, *, min_size: int = 2**18) -> Any:
  """``jax.device_put`` of ``params`` with ``param_shardings`` (replicated when model = 1)."""
  return jax.device_put(params, param_shardings(params, mesh, min_size=min_size))


def place_params(params: Any, mesh: Mesh) -> Any:
  """Like ``shard_params``, but leaves already placed on ``mesh`` (any spec) are kept as they are.

  Cheap to call every step: correctly placed parameters are not copied.
  """
  shardings = param_shardings(params, mesh)

  def put(x, s):
    if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding):
      if x.sharding.mesh == mesh:
        return x
    return jax.device_put(x, s)

  return jax.tree.map(put, params, shardings)


def local_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """The rows (axis 0) of an array split over ``'pop'`` that this process holds.

  Returns:
    ``(row indices [n] int32, values [n, ...])``; on one host, all rows in order.
  """
  if x.is_fully_addressable:
    return np.arange(x.shape[0], dtype=np.int32), np.asarray(x)
  pieces = {}
  for shard in x.addressable_shards:  # replicas (e.g. over 'model') hold the same rows
    start = shard.index[0].start or 0
    if start not in pieces:
      pieces[start] = np.asarray(shard.data)
  starts = sorted(pieces)
  rows = [np.arange(s, s + pieces[s].shape[0], dtype=np.int32) for s in starts]
  return np.concatenate(rows), np.concatenate([pieces[s] for s in starts])


def gather_rows(rows: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
  """The full ``[size, ...]`` array on every process from each process's own rows.

  ``rows``/``values`` are what ``local_rows`` gave this process (every process the same count);
  only these values cross hosts. On one host this is ``values`` put in row order.

  Raises:
    ValueError: some row of ``0 .. size-1`` came from no process.
  """
  rows, values = np.asarray(rows, np.int32), np.asarray(values)
  if jax.process_count() > 1:
    gathered = multihost_utils.process_allgather({"rows": rows, "values": values})
    rows = np.concatenate(list(gathered["rows"]))
    values = np.concatenate(list(gathered["values"]))
  seen = np.zeros(size, bool)
  seen[rows] = True
  if not seen.all():
    raise ValueError(f"gather_rows: rows {np.flatnonzero(~seen).tolist()} of {size} are missing.")
  out = np.empty((size, *values.shape[1:]), values.dtype)
  out[rows] = values
  return out


def is_primary() -> bool:
  """Whether this process writes a run's shared files (process 0; always on one host)."""
  return jax.process_index() == 0


def sync_hosts(name: str) -> None:
  """Waits until every process reaches the barrier `name`; a no-op on one host."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def fetch(tree: Any) -> Any:
  """``tree`` with every array whole on this host: unchanged on one host; on several, each
  array gathered from every process (a collective: every process calls it)."""
  if jax.process_count() == 1:
    return tree
  return multihost_utils.process_allgather(tree, tiled=True)
