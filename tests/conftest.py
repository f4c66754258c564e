"""Shared fixtures. Eight fake CPU devices so sharded code is tested against single-device code."""

import gc
import os

os.environ.setdefault("XLA_FLAGS", "")
# The suite runs on the CPU (fake devices below) even where libtpu is installed for
# tpu_plan_test.py, which compiles for TPU topologies without a TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# No persistent compilation cache in tests (experiments.compile_cache): CLI subprocesses write
# nothing to the user's cache directory; a test that wants one turns it on itself.
os.environ["ES_JAX_COMPILE_CACHE"] = ""

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


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
