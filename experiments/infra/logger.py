"""Run logging: metrics.jsonl, TensorBoard events, the resolved config, package versions.

Progress lines and bars are `experiments.infra.progress`.

Files written into a run's workdir (by process 0 only):

  metrics.jsonl       one JSON object per `RunLogger.log` call, e.g.
                      {"step": 3, "stage": "es", "time": 1767225600.5, "reward/mean": 0.25,
                       "reward/per_member": [0.0, 0.5, null, ...]}
                      `time` is Unix wall time in seconds; `stage` is null outside sequential runs.
                      Nested metric dicts are flattened with "/"; arrays become lists.
                      Non-finite numbers (NaN, ±inf) are written as null, so the file is strict
                      JSON; `read_metrics` turns null back into NaN.
  tensorboard/        event files (tensorboardX, no TensorFlow): a scalar per number, a histogram
                      per array (per-member rewards, ...), tagged with the metric name.
  config.json/.yaml   the resolved config; a previous, different one is kept as config.<n>.json.
  versions.json       package versions, Python, backend, devices and the git commit of the code
                      (`package_versions`; "unknown" outside a git checkout), and under "data"
                      where the run's examples come from (source directory, the source files'
                      SHA-256, rows, limit) when the runner passes `data_sources`.

Resuming: steps must increase over a whole run (a sequential run counts steps across stages).
Create the logger with `resume_step=` the step of the restored checkpoint, or -1 when the run
starts from scratch: lines with a larger step (logged by a killed run after its last checkpoint)
are dropped, and TensorBoard is told to discard that run's events from those steps on
(`purge_step`). Log a step before saving its checkpoint, so a resumed run never misses a line.

A gs:// workdir is written through a local directory whose files are copied to the workdir every
`sync_secs` and on `flush`/`close` (object stores cannot append).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np
import yaml
from etils import epath

# Re-exported for the modules that still import them from here (experiments.evaluation.evaluate).
from experiments.infra.progress import format_seconds as format_seconds
from experiments.infra.progress import progress_marks as progress_marks

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"  # training completions (experiments.infra.samples_log)
TENSORBOARD_DIR = "tensorboard"
VERSIONS_FILE = "versions.json"
_RESERVED = ("step", "stage", "time")
_PACKAGES = (  # distribution names, for importlib.metadata
  "es_jax jax jaxlib flax optax orbax-checkpoint transformers tokenizers numpy ml-collections "
  "tensorboardX"
).split()


def _number(x: float) -> float | None:
  return x if math.isfinite(x) else None


def to_json_value(value: Any, *, name: str = "value") -> Any:
  """A metric value as plain JSON: numpy/jax scalars and arrays converted, non-finite -> None.

  Args:
    value: a bool, int, float, str, None, numpy/jax scalar or array, or a list/tuple of those.
    name: the metric name, for the error message.

  Raises:
    TypeError: naming `name`, for values of any other type.
  """
  if value is None or isinstance(value, bool | int | str):
    return value
  if isinstance(value, float):
    return _number(value)
  if isinstance(value, list | tuple):
    return [to_json_value(v, name=name) for v in value]
  if isinstance(value, np.ndarray | np.generic | jax.Array):
    a = np.asarray(value)
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
      return a.tolist()
    if a.dtype.kind in "fV" or a.dtype.name == "bfloat16":
      a = a.astype(np.float64)  # bfloat16 and float16 too
      return _number(float(a)) if a.ndim == 0 else to_json_value(a.tolist(), name=name)
  raise TypeError(
    f"Metric {name!r}: cannot log a {type(value).__name__} ({value!r:.80}); log numbers, bools, "
    "strings, numpy/jax arrays, or lists of them."
  )


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in metrics.items():
    name = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(_flatten(v, name + "/"))
    elif hasattr(v, "_asdict"):  # NamedTuple metrics, e.g. from es_jax.grpo.loss
      out.update(_flatten(v._asdict(), name + "/"))
    else:
      out[name] = v
  return out


def _config_dict(config: Any) -> dict[str, Any]:
  """A ConfigDict or mapping as a JSON-able dict; values JSON cannot hold become their repr."""
  if hasattr(config, "to_dict"):
    config = config.to_dict()

  def convert(x):
    if isinstance(x, Mapping):
      return {str(k): convert(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
      return [convert(v) for v in x]
    try:
      return to_json_value(x)
    except TypeError:
      return repr(x)

  return convert(config)


def git_commit(directory: str | os.PathLike | None = None) -> str:
  """`git rev-parse HEAD` of the checkout holding `directory` (default: this code's), with "+dirty"
  when tracked files are modified; "unknown" without git or outside a checkout."""
  directory = os.fspath(directory or os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10
    )
    if head.returncode != 0:
      return "unknown"
    status = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no"],
      cwd=directory,
      capture_output=True,
      text=True,
      timeout=10,
    )
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  dirty = status.returncode == 0 and bool(status.stdout.strip())
  return head.stdout.strip() + ("+dirty" if dirty else "")


def package_versions() -> dict[str, Any]:
  """Versions of the packages a run depends on, Python, the devices it sees and the git commit."""
  versions: dict[str, Any] = {}
  for name in _PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  devices = jax.devices()
  versions.update(
    python=platform.python_version(),
    platform=platform.platform(),
    backend=jax.default_backend(),
    device_kind=devices[0].device_kind,
    device_count=jax.device_count(),
    local_device_count=jax.local_device_count(),
    process_count=jax.process_count(),
    git_commit=git_commit(),
  )
  return versions


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Rows of a metrics.jsonl (or of `<workdir>/metrics.jsonl`), nulls turned into NaN.

  A torn last line (a run killed mid-write) is skipped.
  """
  path = epath.Path(path)
  if path.is_dir():
    path = path / METRICS_FILE
  rows, _ = _parse_lines(path.read_text().splitlines() if path.exists() else [])

  def nan(x):
    if x is None:
      return float("nan")
    return [nan(v) for v in x] if isinstance(x, list) else x

  return [{k: v if k in _RESERVED else nan(v) for k, v in row.items()} for row in rows]


def _parse_lines(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
  """Parsed rows and the number of unreadable lines dropped."""
  rows, bad = [], 0
  for line in filter(str.strip, lines):
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      row = None
    if isinstance(row, dict) and isinstance(row.get("step"), int):
      rows.append(row)
    else:
      bad += 1
  return rows, bad


def drop_lines_after(path: epath.Path, resume_step: int | None) -> list[dict[str, Any]]:
  """The rows of a jsonl of {"step": int, ...} lines; unreadable lines and (unless
  `resume_step` is None) lines past `resume_step` are dropped from the file, with a warning for
  the unreadable ones."""
  lines = path.read_text().splitlines() if path.exists() else []
  rows, bad = _parse_lines(lines)
  kept = [r for r in rows if resume_step is None or r["step"] <= resume_step]
  if bad or len(kept) < len(rows):
    # Rewrite through a temporary file and a rename, so a crash here loses no line.
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    if bad:
      warnings.warn(f"{path}: dropped {bad} unreadable line(s).", stacklevel=4)
  return kept


def _write_json_keep_previous(path: epath.Path, data: dict[str, Any], what: str) -> None:
  """Writes JSON; a different existing file is kept as `<stem>.<n>.json`, with a warning."""
  if path.exists():
    try:
      old = json.loads(path.read_text())
    except json.JSONDecodeError:
      old = None
    if old == data:
      return
    n = 1
    while (kept := path.parent / f"{path.stem}.{n}{path.suffix}").exists():
      n += 1
    path.rename(kept)
    changed = sorted(k for k in set(old or {}) | set(data) if (old or {}).get(k) != data.get(k))
    warnings.warn(
      f"{what} differs from this workdir's previous one in {changed}; kept the old one as {kept}.",
      stacklevel=3,
    )
  # Written whole or not at all: a killed write leaves the previous file or none.
  tmp = path.parent / f".{path.name}.tmp"
  tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
  tmp.rename(path)


def write_run_files(workdir: str | os.PathLike, config: Any) -> None:
  """config.json, config.yaml and versions.json into a local `workdir` (as `RunLogger` writes
  them), for runs that log no metrics (evaluations); on process 0 only."""
  if jax.process_index() != 0:
    return
  path = epath.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  resolved = _config_dict(config)
  _write_json_keep_previous(path / "config.json", resolved, "config")
  (path / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=True))
  _write_json_keep_previous(path / VERSIONS_FILE, package_versions(), "versions")


class RunLogger:
  """Writes a run's metrics.jsonl, TensorBoard events, config and versions (see module doc)."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    *,
    config: Any = None,
    tensorboard: bool = True,
    resume_step: int | None = None,
    local_dir: str | os.PathLike | None = None,
    sync_secs: float = 60.0,
    enabled: bool | None = None,
    data_sources: Mapping[str, Any] | None = None,
  ):
    """Opens (appending) the logs of `workdir`.

    Args:
      workdir: the run's directory, local or gs://; created if missing.
      config: the resolved config (ConfigDict or mapping) to save, or None.
      tensorboard: also write TensorBoard event files.
      resume_step: drop lines with a larger step (see module doc): the restored checkpoint's
        step, or -1 for a run from scratch; None keeps every line (plain append).
      local_dir: write files here and copy them to `workdir` every `sync_secs` and on
        flush/close; default: `workdir` itself when local, a temporary directory when remote.
      sync_secs: seconds between copies to a remote `workdir`.
      enabled: write anything at all; default: only on process 0.
      data_sources: {config section: `TaskExamples.source`}, stored in versions.json as "data".
    """
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.workdir = epath.Path(workdir)
    self._last_step: int | None = None
    self._file = self._writer = None
    if not self.enabled:
      return
    remote = "://" in os.fspath(workdir)
    self._sync_to = self.workdir if (remote or local_dir is not None) else None
    if self._sync_to is not None and local_dir is None:
      local_dir = tempfile.mkdtemp(prefix="es_jax_logs_")
    self.local_dir = epath.Path(local_dir) if local_dir is not None else self.workdir
    self.local_dir.mkdir(parents=True, exist_ok=True)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._sync_secs, self._last_sync = sync_secs, time.monotonic()

    if self._sync_to is not None:  # continue from the workdir's files, if any
      for name in (METRICS_FILE, SAMPLES_FILE, "config.json", VERSIONS_FILE):
        if (self.workdir / name).exists():
          (self.workdir / name).copy(self.local_dir / name, overwrite=True)
    self._open_metrics(self.local_dir / METRICS_FILE, resume_step)

    if config is not None:
      resolved = _config_dict(config)
      _write_json_keep_previous(self.local_dir / "config.json", resolved, "config")
      (self.local_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=True))
    versions = package_versions()
    if data_sources is not None:
      versions["data"] = json.loads(
        json.dumps(dict(data_sources), default=lambda x: to_json_value(x, name="data_sources"))
      )
    _write_json_keep_previous(self.local_dir / VERSIONS_FILE, versions, "versions")

    if tensorboard:
      from tensorboardX import SummaryWriter  # import here: it is slow and optional

      purge = None if resume_step is None else resume_step + 1
      # File names hold the second of creation only: a suffix keeps quick restarts apart.
      self._writer = SummaryWriter(
        os.fspath(self.local_dir / TENSORBOARD_DIR),
        purge_step=purge,
        flush_secs=30,
        filename_suffix=f".{time.time_ns()}",
      )
    self.sync()

  def _open_metrics(self, path: epath.Path, resume_step: int | None) -> None:
    kept = drop_lines_after(path, resume_step)
    self._last_step = max((r["step"] for r in kept), default=None)
    self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

  def last_logged_step(self) -> int | None:
    """The largest step in metrics.jsonl (after any `resume_step` truncation), or None."""
    return self._last_step

  def log(self, step: int, metrics: Mapping[str, Any], *, stage: str | None = None) -> None:
    """Appends one line to metrics.jsonl and the TensorBoard summaries of `metrics`.

    Args:
      step: the global training step (ints only; increasing over the run).
      metrics: name -> number, bool, string, numpy/jax scalar or array, list, or nested dict
        (flattened to "outer/inner"). Names "step", "stage" and "time" are reserved.
      stage: the stage of a sequential run ("es", "grpo", ...), or None.
    """
    if not self.enabled:
      return
    flat = _flatten(metrics)
    clash = [k for k in flat if k in _RESERVED]
    if clash:
      raise ValueError(f"RunLogger.log: metric names {clash} are reserved; rename them.")
    row = {"step": int(step), "stage": stage, "time": time.time()}
    values = {name: to_json_value(v, name=name) for name, v in flat.items()}
    self._file.write(json.dumps({**row, **values}, allow_nan=False) + "\n")
    self._file.flush()
    if self._last_step is None or step > self._last_step:
      self._last_step = int(step)
    if self._writer is not None:
      for name, v in values.items():
        self._summarise(name, v, int(step), row["time"])
    if self._sync_to is not None and time.monotonic() - self._last_sync > self._sync_secs:
      self.flush()

  def summaries(self, step: int, metrics: Mapping[str, Any]) -> None:
    """TensorBoard summaries of `metrics` at `step`, without a metrics.jsonl line (for results
    kept in files of their own, such as the final evaluation's eval/table.json)."""
    if self._writer is None:
      return
    now = time.time()
    for name, v in _flatten(metrics).items():
      self._summarise(name, to_json_value(v, name=name), int(step), now)

  def text(self, tag: str, markdown: str, step: int) -> None:
    """A TensorBoard text summary (markdown) at `step`, e.g. sampled completions."""
    if self._writer is not None:
      self._writer.add_text(tag, markdown, int(step))

  def _summarise(self, name: str, value: Any, step: int, walltime: float) -> None:
    if isinstance(value, bool | int | float) or value is None:
      scalar = float("nan") if value is None else float(value)
      self._writer.add_scalar(name, scalar, step, walltime=walltime)
    elif isinstance(value, list):
      try:
        a = np.asarray(value, dtype=np.float64).ravel()  # None (non-finite) -> NaN
      except (TypeError, ValueError):
        return  # strings or ragged lists: in metrics.jsonl only
      a = a[np.isfinite(a)]
      if a.size:
        self._writer.add_histogram(name, a, step, walltime=walltime)

  def flush(self) -> None:
    """Flushes the files and copies them to a remote workdir."""
    if not self.enabled or self._file is None:
      return
    self._file.flush()
    if self._writer is not None:
      self._writer.flush()
    self.sync()

  def sync(self) -> None:
    """Copies the local files to the workdir when they are written elsewhere (remote workdirs)."""
    if not self.enabled or self._sync_to is None:
      return
    for root, _, files in os.walk(self.local_dir):
      for f in files:
        if f.endswith(".tmp"):
          continue
        src = epath.Path(root) / f
        dst = self._sync_to / src.relative_to(self.local_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.copy(dst, overwrite=True)
    self._last_sync = time.monotonic()

  def close(self) -> None:
    """Flushes and closes the files (idempotent)."""
    if not self.enabled or self._file is None:
      return
    self._file.flush()
    if self._writer is not None:
      self._writer.close()
    self._file.close()
    self.sync()
    self._file = self._writer = None

  def __enter__(self) -> RunLogger:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
