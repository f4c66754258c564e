"""experiments.infra.compile_cache: where the CLI's persistent compilation cache lives, that a
second process loads what the first compiled, and the compile-seconds counter."""

import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp

from experiments.infra import compile_cache

# A fresh process: turns the cache on in argv[1], compiles one program, prints what JAX reported.
_CHILD = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
from experiments.infra import compile_cache
events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
compile_cache.enable(sys.argv[1])
compile_cache.compile_seconds()
x = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0))(jnp.ones((96, 96)))
jax.block_until_ready(x)
print(json.dumps({
  "hits": events.count("/jax/compilation_cache/cache_hits"),
  "misses": events.count("/jax/compilation_cache/cache_misses"),
  "seconds": compile_cache.compile_seconds(),
  "value": float(x[0]),
}))
"""


def _child(cache_dir) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-c", _CHILD, str(cache_dir)],
    capture_output=True,
    text=True,
    check=True,
    env=env,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_program_from_the_cache(tmp_path):
  cache = tmp_path / "jax"
  first = _child(cache)
  assert first["misses"] >= 1 and first["hits"] == 0  # compiled, and written
  files = sorted(os.listdir(cache))
  assert any(name.startswith("jit_") for name in files)
  second = _child(cache)
  assert second["hits"] == first["misses"] and second["misses"] == 0  # nothing compiled again
  assert sorted(os.listdir(cache)) == files  # nothing new written
  assert second["value"] == first["value"]
  assert first["seconds"] > 0 and second["seconds"] > 0  # a load counts its (shorter) time


def test_default_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compile_cache.default_dir() == str(tmp_path / "xdg" / "es_jax" / "jax")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compile_cache.default_dir() == str(tmp_path / "home" / ".cache" / "es_jax" / "jax")
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "moved"))
  assert compile_cache.default_dir() == str(tmp_path / "moved")
  monkeypatch.setenv(compile_cache.ENV, "")
  assert compile_cache.default_dir() is None
  assert compile_cache.enable(None) is None and compile_cache.enable("") is None


def test_tests_share_one_temporary_cache_and_write_nothing_to_home():
  # tests/conftest.py turns the cache on in one temporary directory per pytest session, and hands
  # it to CLI subprocesses through ES_JAX_COMPILE_CACHE: nothing is written to $HOME's cache.
  session = os.environ[compile_cache.ENV]
  assert session and compile_cache.default_dir() == session
  assert jax.config.jax_compilation_cache_dir == session
  if os.environ.get("ES_JAX_TEST_COMPILE_CACHE"):  # a directory kept across sessions
    assert session == os.environ["ES_JAX_TEST_COMPILE_CACHE"]
  else:
    assert os.path.basename(session).startswith("es_jax_test_compile_cache_")
    assert os.path.dirname(session) == tempfile.gettempdir()


def test_compile_seconds_grows_when_a_new_program_compiles():
  x, y = jnp.arange(37.0), jnp.ones(37)
  before = compile_cache.compile_seconds()
  f = jax.jit(lambda a: jnp.cumsum(jnp.sin(a) * 3.0))
  jax.block_until_ready(f(x))
  after = compile_cache.compile_seconds()
  assert after > before
  jax.block_until_ready(f(y))  # compiled already: nothing added
  assert compile_cache.compile_seconds() == after
