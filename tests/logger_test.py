"""Tests for experiments.infra.logger (metrics.jsonl, TensorBoard events, resume, config and
versions) and experiments.infra.progress."""

import hashlib
import io
import json
import logging
import platform
import re
import struct
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import yaml
from tensorboardX.proto import event_pb2

from es_jax.devices import sharding
from experiments.infra import logger as logger_lib
from experiments.infra.logger import (
  METRICS_FILE,
  TENSORBOARD_DIR,
  VERSIONS_FILE,
  RunLogger,
  read_metrics,
)
from experiments.infra.progress import ProgressBar, StepTimer, format_seconds, progress_marks


def _events(workdir):
  """Every Event record of the TensorBoard files under workdir, parsed from the TFRecord frames."""
  events = []
  files = sorted((workdir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
  assert files, f"no event file under {workdir / TENSORBOARD_DIR}"
  for path in files:
    data, pos = path.read_bytes(), 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      record = data[pos + 12 : pos + 12 + length]  # skip the length's CRC
      assert len(record) == length, f"truncated record in {path}"
      events.append(event_pb2.Event.FromString(record))
      pos += 12 + length + 4  # and the data's CRC
  return events


def _scalars(workdir):
  out = {}
  for e in _events(workdir):
    for v in e.summary.value:
      if v.HasField("simple_value"):
        out.setdefault(v.tag, []).append((e.step, v.simple_value))
  return out


def _config():
  return ml_collections.ConfigDict(
    {"method": "es", "es": {"sigma": 1.5e-3, "population_size": 8}, "steps": (1, 2)}
  )


def test_jsonl_round_trip_and_nan_as_null(tmp_path):
  metrics = {
    "reward": {"mean": np.float32(0.25), "max": jnp.asarray(1.0, jnp.bfloat16)},
    "per_member": jnp.array([0.5, jnp.nan, 1.0]),
    "count": np.int64(7),
    "ok": True,
    "loss": float("nan"),
    "big": float("inf"),
    "note": "hi",
  }
  with RunLogger(tmp_path, tensorboard=False) as logger:
    logger.log(1, metrics, stage="es")
    logger.log(2, {"reward": {"mean": 0.5}})
    assert logger.last_logged_step() == 2
  lines = (tmp_path / METRICS_FILE).read_text().splitlines()
  assert len(lines) == 2

  def no_constants(name):
    raise AssertionError(f"non-standard JSON constant {name}")

  first = json.loads(lines[0], parse_constant=no_constants)
  assert first["step"] == 1 and first["stage"] == "es" and first["time"] > 1.6e9
  assert first["reward/mean"] == 0.25 and first["reward/max"] == 1.0
  assert first["per_member"] == [0.5, None, 1.0]
  assert first["count"] == 7 and first["ok"] is True and first["note"] == "hi"
  assert first["loss"] is None and first["big"] is None
  rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == [1, 2] and rows[1]["stage"] is None
  assert np.isnan(rows[0]["loss"]) and np.isnan(rows[0]["per_member"][1])
  assert rows[1]["time"] >= rows[0]["time"]


def test_bad_metrics_are_named(tmp_path):
  with RunLogger(tmp_path, tensorboard=False) as logger:
    with pytest.raises(ValueError, match="step"):
      logger.log(1, {"step": 3})
    with pytest.raises(TypeError, match="'weird'"):
      logger.log(1, {"weird": object()})


def test_tensorboard_scalars_and_histograms(tmp_path):
  with RunLogger(tmp_path) as logger:
    for step in (1, 2, 3):
      logger.log(step, {"reward/mean": 0.1 * step, "per_member": np.arange(8.0) + step})
  scalars = _scalars(tmp_path)
  steps, values = zip(*scalars["reward/mean"], strict=True)
  assert steps == (1, 2, 3)
  np.testing.assert_allclose(values, [0.1, 0.2, 0.3], rtol=1e-6)
  histos = [
    (e.step, v.histo) for e in _events(tmp_path) for v in e.summary.value if v.HasField("histo")
  ]
  assert [s for s, _ in histos] == [1, 2, 3]
  assert histos[0][1].num == 8 and histos[0][1].min == 1.0 and histos[0][1].max == 8.0


def test_resume_drops_lines_after_checkpoint_and_purges_tensorboard(tmp_path):
  with RunLogger(tmp_path) as logger:
    for step in range(1, 6):
      logger.log(step, {"x": float(step)})
  # Killed mid-write: a torn last line.
  with open(tmp_path / METRICS_FILE, "a") as f:
    f.write('{"step": 6, "x": ')
  # Resumed from the checkpoint of step 3: steps 4 and 5 are logged again.
  with pytest.warns(UserWarning, match="unreadable"):
    logger = RunLogger(tmp_path, resume_step=3)
  with logger:
    assert logger.last_logged_step() == 3
    for step in (4, 5):
      logger.log(step, {"x": 10.0 * step})
  rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
  assert [r["x"] for r in rows] == [1.0, 2.0, 3.0, 40.0, 50.0]
  # TensorBoard is told to discard the killed run's events from step 4 on.
  starts = [e.step for e in _events(tmp_path) if e.session_log.status == 1]  # START
  assert starts == [4]
  # Without resume_step the file is appended to, never clobbered.
  with RunLogger(tmp_path, tensorboard=False) as logger:
    assert logger.last_logged_step() == 5
    logger.log(6, {"x": 6.0})
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
  # A run from scratch in the same workdir (no checkpoint survived) drops every old line.
  with RunLogger(tmp_path, resume_step=-1) as logger:
    assert logger.last_logged_step() is None
    logger.log(0, {"x": 0.0})
  assert [r["step"] for r in read_metrics(tmp_path)] == [0]
  assert [e.step for e in _events(tmp_path) if e.session_log.status == 1] == [4, 0]


def test_config_and_versions_files(tmp_path):
  config = _config()
  with RunLogger(tmp_path, config=config, tensorboard=False):
    pass
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved == {"method": "es", "es": {"sigma": 1.5e-3, "population_size": 8}, "steps": [1, 2]}
  assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == saved
  versions = json.loads((tmp_path / VERSIONS_FILE).read_text())
  assert versions["jax"] == jax.__version__ and versions["jaxlib"] == jax.__version__
  assert versions["python"] == platform.python_version()
  assert versions["device_count"] == jax.device_count() == 8
  assert versions["backend"] == "cpu" and versions["device_kind"]
  for name in ("flax", "optax", "orbax-checkpoint", "numpy"):
    assert versions[name], name
  assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", versions["git_commit"]), versions["git_commit"]
  assert logger_lib.git_commit(tmp_path) == "unknown"  # not a checkout
  assert "data" not in versions
  sources = {"data": {"task": "gsm8k", "source_dir": "/d", "rows": np.int64(7), "used": 5}}
  with RunLogger(tmp_path / "b", tensorboard=False, data_sources=sources):
    pass
  data = json.loads((tmp_path / "b" / VERSIONS_FILE).read_text())["data"]
  assert data == {"data": {"task": "gsm8k", "source_dir": "/d", "rows": 7, "used": 5}}
  # Resuming with a changed config keeps the old one and says which field changed.
  config.es.sigma = 3e-3
  with pytest.warns(UserWarning, match="'es'"):
    RunLogger(tmp_path, config=config, tensorboard=False).close()
  assert json.loads((tmp_path / "config.1.json").read_text()) == saved
  assert json.loads((tmp_path / "config.json").read_text())["es"]["sigma"] == 3e-3


def config_hash(config) -> str:
  """A short hash of the resolved config the logger writes (config.json): stable across a
  ConfigDict and its dict, and changed by any field."""
  text = json.dumps(logger_lib._config_dict(config), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_config_hash_is_stable_and_sensitive():
  a, b = _config(), _config()
  assert config_hash(a) == config_hash(b) == config_hash(a.to_dict())
  b.es.population_size = 16
  assert config_hash(a) != config_hash(b)


def test_remote_style_workdir_is_synced_from_a_local_dir(tmp_path):
  remote = tmp_path / "remote"
  with RunLogger(remote, config=_config(), local_dir=tmp_path / "local1") as logger:
    logger.log(1, {"x": 1.0})
    logger.log(2, {"x": 2.0})
  assert (remote / METRICS_FILE).read_text() == (tmp_path / "local1" / METRICS_FILE).read_text()
  assert (remote / "config.json").exists() and (remote / VERSIONS_FILE).exists()
  assert "x" in _scalars(remote)
  # A new machine (new local dir) continues the workdir's file.
  with RunLogger(remote, resume_step=1, local_dir=tmp_path / "local2") as logger:
    assert logger.last_logged_step() == 1
    logger.log(2, {"x": 20.0})
  assert [r["x"] for r in read_metrics(remote)] == [1.0, 20.0]


def test_disabled_logger_writes_nothing(tmp_path):
  with RunLogger(tmp_path / "w", config=_config(), enabled=False) as logger:
    logger.log(1, {"x": 1.0})
  assert not (tmp_path / "w").exists()


def test_progress_bar():
  quiet = io.StringIO()
  with ProgressBar(5, file=quiet) as bar:  # StringIO is not a terminal: off by default
    bar.update(loss=0.5)
  assert not bar.enabled and quiet.getvalue() == ""
  shown = io.StringIO()
  with ProgressBar(5, initial=1, desc="es", enabled=True, file=shown) as bar:
    bar.update(loss=0.123456)
  text = shown.getvalue()
  assert "es" in text and "2/5" in text and "loss=0.1235" in text


def test_step_timer_lines_and_progress_marks(monkeypatch):
  clock = iter([100.0, 110.0, 130.0])  # start, after step 3, after step 4 (resumed at step 2)
  monkeypatch.setattr(logger_lib.time, "perf_counter", lambda: next(clock))
  timer = StepTimer(10, initial=2, name="es")
  assert (
    timer.line(3, 0.25, 10.0)
    == "es step 3/10 | train/reward 0.2500 | 10.00 s/step | ETA 1 min 10 s"
  )
  line = timer.line(4, None)  # 15 s per step so far, 6 steps left
  assert line == "es step 4/10 | 15.00 s/step | ETA 1 min 30 s"
  assert format_seconds(7300) == "2 h 01 min" and format_seconds(float("nan")) == "?"
  assert progress_marks(25, 0) == {3, 6, 9, 12, 15, 18, 21, 24, 25}
  assert progress_marks(25, 20) == {21, 24, 25} and progress_marks(1, 0) == {1}


@pytest.fixture
def cli_logging(request):
  """experiments.main's logging setup at verbosity `request.param`, undone afterwards."""
  from absl import logging as absl_logging

  from experiments import main

  names = ("", "experiments", "es_jax", *main.QUIET_LOGGERS)
  levels = {n: logging.getLogger(n).level for n in names}
  absl_level = absl_logging.get_verbosity()
  logging.getLogger().setLevel(logging.INFO)  # as absl.app leaves it
  absl_logging.set_verbosity(absl_logging.INFO)
  main.setup_logging(request.param)
  yield request.param
  for n, level in levels.items():
    logging.getLogger(n).setLevel(level)
  absl_logging.set_verbosity(absl_level)


@pytest.mark.parametrize("cli_logging", [0, 1], indirect=True, ids=["default", "verbosity1"])
def test_loop_logs_one_line_per_step_and_orbax_only_when_verbose(tmp_path, caplog, cli_logging):
  from experiments.configs import demo
  from experiments.runners import train_loop

  config = ml_collections.ConfigDict(demo.get_config("smoke").to_dict())
  config.method, config.progress, config.eval.every = "es", False, 5
  config.checkpoint.async_save = False
  # The base model's periodic evaluation (step 0) has a line of its own, saying so.
  evaluator = types.SimpleNamespace(
    periodic=lambda params, model_config: {"eval/greedy": 0.25, "eval/pass@1": 0.5, "eval/x": 1.0}
  )
  ctx = types.SimpleNamespace(
    config=config,
    workdir=str(tmp_path),
    base_params=None,
    mesh=sharding.make_mesh(pop=1),  # the base params are placed for their evaluation
    model_config=None,
    evaluator=evaluator,
    data_sources={},
  )
  stage = train_loop.Stage("es", 2, str(tmp_path / "checkpoints"))
  state = {"w": jnp.zeros(3)}
  loop = train_loop.Loop(ctx, stage, state)
  for step in loop.steps():
    loop.end_step(step, state, {"train/reward": 0.5 * step})
  loop.close()
  lines = [r.getMessage() for r in caplog.records if r.name == "experiments.runners.train_loop"]
  steps = [m for m in lines if " step " in m]
  assert len(steps) == 3, lines
  assert steps.pop(0).startswith("periodic eval at step 0 (before training): greedy 0.250 pass@1")
  assert steps[0].startswith("es step 1/2 | train/reward 0.5000 |") and "ETA" in steps[0]
  assert steps[1].startswith("es step 2/2 | train/reward 1.0000 |") and steps[1].endswith("ETA 0 s")
  assert (tmp_path / "checkpoints" / "2").exists()
  orbax = [r for r in caplog.records if r.levelno < logging.WARNING and r.name == "absl"]
  if cli_logging == 0:  # Orbax logs its INFO lines through absl
    assert not orbax, [r.getMessage() for r in orbax[:5]]
  else:
    assert orbax  # --verbosity=1 shows them
  rows = read_metrics(tmp_path)
  per_step = config.data.prompts_per_step * config.es.population_size
  assert rows[0]["step"] == 0 and rows[0]["eval/greedy"] == 0.25
  assert [r["train/samples"] for r in rows[1:]] == [per_step, 2 * per_step]
