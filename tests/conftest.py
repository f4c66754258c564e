"""Shared fixtures. Eight fake CPU devices so sharded code is tested against single-device code."""

import gc
import os
import shutil
import tempfile

# XLA:CPU compiles test programs cheaply: the suite is compile-bound (hundreds of small programs,
# each run a few times). LLVM's optimisation level 0 took 29% less CPU time on sampling_test.py
# and 15% less on golden_test.py; the classic loop emitters instead of the fusion emitters took a
# further 30% off sharding_test.py and 26% off reference_arithmetic_test.py (docs/testing.md).
# Tokens, bitwise references and the golden record are the same. A flag already set in
# $XLA_FLAGS wins; CLI subprocesses drop the flags.
TEST_XLA_FLAGS = {
  "xla_backend_optimization_level": "0",
  "xla_cpu_use_fusion_emitters": "false",
}
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
_ADDED = [f"--{k}={v}" for k, v in TEST_XLA_FLAGS.items() if k not in _XLA_FLAGS]
os.environ["XLA_FLAGS"] = " ".join([_XLA_FLAGS, *_ADDED]).strip()
# The suite runs on the CPU (fake devices below) even where libtpu is installed for
# tpu_plan_test.py, which compiles for TPU topologies without a TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

# One persistent compilation cache per pytest session (`_session_cache`), passed to the xdist
# workers; the workers' `experiments.main` subprocesses get it through $ES_JAX_COMPILE_CACHE.
_CACHE_OPTION = "es_jax_compile_cache"
# Set to a directory, the session uses it and leaves it in place: a later session (the next
# `make test-fast` while working) loads every program an earlier one compiled.
KEEP_CACHE_ENV = "ES_JAX_TEST_COMPILE_CACHE"


def _session_cache(config) -> str:
  """The session's compilation-cache directory: made by the process that owns the session (the
  xdist controller, or the only process), handed to each worker in its `workerinput`."""
  workerinput = getattr(config, "workerinput", None)
  if workerinput is not None:
    return workerinput[_CACHE_OPTION]
  if os.environ.get(KEEP_CACHE_ENV):
    return os.environ[KEEP_CACHE_ENV]
  if not hasattr(config, "_es_jax_compile_cache"):
    config._es_jax_compile_cache = tempfile.mkdtemp(prefix="es_jax_test_compile_cache_")
  return config._es_jax_compile_cache


def pytest_configure(config):
  """Turns on JAX's persistent compilation cache in the session's directory before any test
  compiles.

  Many tests in many processes compile the same programs (the same tiny model shapes); with every
  program written (no minimum compile time or size), the second process loads what the first
  compiled. JAX keys an entry by the program, the versions and the backend with its flags, so a
  hit is the program a compile would have made. The directory is a fresh temporary one (nothing
  is written to the user's cache) and is removed when the session ends.
  """
  path = _session_cache(config)
  os.environ["ES_JAX_COMPILE_CACHE"] = path  # experiments.infra.compile_cache, for CLI subprocesses
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  """xdist: hands the controller's cache directory to a worker it starts."""
  node.workerinput[_CACHE_OPTION] = _session_cache(node.config)


def pytest_unconfigure(config):
  """Removes the session's cache directory (only its owner does; the workers have exited)."""
  if getattr(config, "workerinput", None) is None and hasattr(config, "_es_jax_compile_cache"):
    shutil.rmtree(config._es_jax_compile_cache, ignore_errors=True)


# Files that compile for TPU topologies without a TPU: a compile-only client cannot load a cached
# program back (JAX warns and compiles again), so their tests write nothing to the session cache.
DEVICELESS_FILES = ("tpu_plan_test.py",)


@pytest.fixture(autouse=True)
def _no_cache_writes_from_deviceless_compiles(request):
  if request.path.name not in DEVICELESS_FILES:
    yield
    return
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  try:
    yield
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


@pytest.fixture
def key():
  return jax.random.key(0)


# vm.max_map_count is 65530 by default; a worker clears its caches well before that.
MAX_MAPS = 20_000


def _memory_maps() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux: nothing to count
    return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops every compiled program after a test file once the process holds many memory maps.

  XLA:CPU maps each compiled program's code and data into the process (three or more memory
  maps each) and keeps it while a cache holds the program. One pytest worker runs dozens of
  files and compiles thousands of programs; without this it reaches the kernel's
  vm.max_map_count (65530) and the next compile segfaults inside XLA. Below `MAX_MAPS` the
  caches stay, so later files reuse the programs they share.
  """
  yield
  if _memory_maps() > MAX_MAPS:
    jax.clear_caches()
    gc.collect()


def pytest_report_header(config):
  """Says which tier runs: `-m "not slow"` (`make test-fast`) leaves the slow tests out."""
  markexpr = config.getoption("markexpr")
  if "slow" in markexpr:
    return (
      f"tier: -m {markexpr!r} (tests marked slow are run by `make test-slow`; `make test` runs all)"
    )
  return None


# The quick tier's heaviest files, heaviest first (their test-seconds in the run docs/testing.md
# records). `make test-fast` runs files in collection order (--no-loadscope-reorder) and hands
# one file at a time to each worker: starting with the longest files and ending with the short
# ones leaves neither worker idle for long at the end. The order changes no result.
HEAVY_FILES = (
  "user_reward_test.py",
  "sampling_test.py",
  "sharding_test.py",
  "runners_test.py",
  "reference_arithmetic_test.py",
  "population_test.py",
  "decode_loop_test.py",
  "grpo_update_test.py",
  "rewards_hostile_test.py",
  "models_test.py",
  "tpu_plan_test.py",
  "eval_sampler_test.py",
  "es_test.py",
  "checkpoint_test.py",
  "noise_test.py",
  "report_test.py",
)


# The slow tier's heaviest files, heaviest first (its longest tests in the runs of docs/testing.md):
# `make test-slow` hands them out first in the same way.
SLOW_HEAVY_FILES = (
  "runners_process_test.py",
  "study_v2_test.py",
  "runners_test.py",
  "decode_queue_test.py",
  "fair_study_test.py",
  "benchmarks_test.py",
  "usage_test.py",
  "multihost_runs_test.py",
  "multihost_test.py",
  "evaluate_test.py",
)


def pytest_collection_modifyitems(config, items):
  """Runs the files of `HEAVY_FILES` (`SLOW_HEAVY_FILES` for `-m slow`) first, in that order; the
  rest keep their order."""
  heavy = SLOW_HEAVY_FILES if config.getoption("markexpr", "") == "slow" else HEAVY_FILES
  rank = {name: i for i, name in enumerate(heavy)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
