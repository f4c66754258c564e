"""Compiled programs kept across processes (JAX's persistent compilation cache) and the seconds a
run spends compiling.

`experiments.main` turns the cache on before anything compiles, in `default_dir()`:
``$ES_JAX_COMPILE_CACHE`` when set (empty: off), else ``$XDG_CACHE_HOME/es_jax/jax``, else
``~/.cache/es_jax/jax``; its ``--compile_cache=DIR`` flag moves it, ``--compile_cache=`` turns it
off. Every program is written (no minimum compile time or size), so a later stage of the demo, a
rerun or a resumed run loads what an earlier one compiled instead of compiling it again. JAX keys
an entry by the program, the JAX and XLA versions, the backend and its flags, so a stale entry is
never used; deleting the directory is always safe. Library code (es_jax/) never turns it on, nor
do the unit tests (tests/conftest.py sets ``ES_JAX_COMPILE_CACHE`` empty).

`compile_seconds()` is the process's running total of tracing, lowering and XLA compilation
(a program loaded from the cache counts its load time), read from `jax.monitoring` events; the
training loop logs each step's share (experiments.runners.train_loop).
"""

from __future__ import annotations

import os
import threading

import jax
from jax import monitoring

ENV = "ES_JAX_COMPILE_CACHE"
# jax.monitoring's duration events that make up "compiling": tracing a jitted function, lowering
# it to StableHLO, and XLA's compile (or, on a persistent-cache hit, loading the executable).
COMPILE_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "/jax/core/compile/backend_compile_duration",
)
_lock = threading.Lock()
_total = {"seconds": 0.0, "listening": False}


def default_dir() -> str | None:
  """The cache directory the CLI uses unless told otherwise; None when ``$ES_JAX_COMPILE_CACHE``
  is set empty (cache off)."""
  if ENV in os.environ:
    return os.environ[ENV] or None
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "es_jax", "jax")


def enable(path: str | None) -> str | None:
  """Turns JAX's persistent compilation cache on in `path` (None or "": leaves it off).

  Call before the first compile: JAX reads the setting once per process. Returns `path`.
  """
  if not path:
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  # Cache every program: on a CPU even the small ones take tenths of a second each.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def _on_duration(event: str, seconds: float, **_) -> None:
  if event in COMPILE_EVENTS:
    with _lock:
      _total["seconds"] += seconds


def compile_seconds() -> float:
  """Seconds this process has spent compiling since the first call (which starts listening)."""
  with _lock:
    if not _total["listening"]:
      monitoring.register_event_duration_secs_listener(_on_duration)
      _total["listening"] = True
    return _total["seconds"]
