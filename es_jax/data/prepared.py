"""Prepared copies of the file-backed datasets: `prepare(name, source_dir=...)`.

The user downloads each dataset once and passes its directory as `source_dir` (TFDS's
`manual_dir`). `prepare` runs the dataset's builder (`es_jax.data.builders`), which writes the
examples as array_record files, keyed by the source directory:
`<data_dir>/by_source/<name>/<source dir name>-<hash of its path>/<name>/1.0.0/`, which
`tfds.data_source` and `builder.as_data_source()` read without TensorFlow. Two source directories
of one dataset never share (or overwrite) prepared data; a preparation is written into a private
temporary directory and renamed into place when complete, so concurrent preparations cannot mix
their files. Without `source_dir`, the one prepared copy of the dataset is read; when several
source directories were prepared, `source_dir` must say which. A copy whose source files changed
(their SHA-256 fingerprint in its metadata) is prepared again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from es_jax.data.builders import (
  BUILDERS,
  LocalFileBuilder,
  expected_files,
  find_sources,
  fingerprint,
)

log = logging.getLogger(__name__)
BY_SOURCE = "by_source"  # <data_dir>/by_source/<name>/<source key>/ (module docstring)


def source_key(source_dir: Path) -> str:
  """The directory name of `source_dir`'s prepared data: its base name and a hash of its path."""
  text = str(source_dir)
  base = re.sub(r"[^A-Za-z0-9_.-]+", "_", source_dir.name)[:40] or "root"
  return f"{base}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _data_root(data_dir: str | None) -> Path:
  return Path(data_dir or tfds.core.constants.DATA_DIR).expanduser().resolve()


def _builder(cls: type[LocalFileBuilder], data_dir: Path) -> LocalFileBuilder:
  return cls(data_dir=str(data_dir), file_format="array_record")


def _prepared_copies(cls: type[LocalFileBuilder], base: Path) -> list[LocalFileBuilder]:
  if not base.is_dir():
    return []
  dirs = sorted(d for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
  return [b for b in (_builder(cls, d) for d in dirs) if b.is_prepared()]


def _publish(tmp: Path, target: Path, want: dict[str, list]) -> None:
  """Renames the complete preparation `tmp` to `target` (a stale `target` is replaced)."""
  if target.is_dir():
    current = _builder(BUILDERS[target.parent.name], target)
    if current.is_prepared() and current.info.metadata.get("sources") == want:
      shutil.rmtree(tmp, ignore_errors=True)  # prepared meanwhile by another process
      return
    stale = target.with_name(f".stale-{target.name}-{uuid.uuid4().hex[:8]}")
    try:
      os.rename(target, stale)
    except FileNotFoundError:
      stale = None
  else:
    stale = None
  try:
    os.rename(tmp, target)
  except OSError:  # another process published its (identical-source) copy first
    shutil.rmtree(tmp, ignore_errors=True)
  if stale is not None:
    shutil.rmtree(stale, ignore_errors=True)


def _only_copy(cls: type[LocalFileBuilder], base: Path) -> LocalFileBuilder:
  """The one copy of `cls`'s dataset prepared under `base` (`prepare` without source_dir)."""
  name = cls.name
  copies = _prepared_copies(cls, base)
  if len(copies) > 1:
    listed = "; ".join(str(b.info.metadata.get("source_dir")) for b in copies)
    raise ValueError(
      f"{name}: prepared from {len(copies)} source directories under {base} ({listed}); pass "
      "source_dir= (data.source_dir / eval.source_dir) to say which one to use."
    )
  if copies:
    log.info(
      "%s: reading the copy prepared from %s", name, copies[0].info.metadata.get("source_dir")
    )
    return copies[0]
  raise FileNotFoundError(
    f"{name} is not prepared in {base}: pass source_dir=, the directory holding the "
    f"downloaded files ({expected_files(name)}); see es_jax/data/builders.py for sources."
  )


def prepare(
  name: str, *, data_dir: str | None = None, source_dir: str | None = None, progress: bool = True
):
  """Prepares dataset `name` from `source_dir` if needed, and returns its builder.

  Args:
    name: one of `BUILDERS`.
    data_dir: the root of the prepared data (None: TFDS's default, $TFDS_DATA_DIR or
      ~/tensorflow_datasets); each source directory's copy lives in its own subdirectory
      (module docstring).
    source_dir: the directory holding the downloaded original files. None reads the one copy of
      `name` prepared under `data_dir`.
    progress: show TFDS's progress bars while preparing (on a terminal only).

  Returns:
    A `LocalFileBuilder` whose data is prepared and whose metadata lists the bad rows, the source
    directory ("source_dir") and the source files' SHA-256 ("sources").

  Raises:
    FileNotFoundError: nothing prepared and no (usable) source_dir.
    ValueError: no source_dir, and copies from several source directories are prepared.
  """
  cls = BUILDERS[name]
  base = _data_root(data_dir) / BY_SOURCE / name
  if source_dir is None:
    return _only_copy(cls, base)
  source_path = Path(source_dir).expanduser().resolve()
  sources = find_sources(cls, source_path) if source_path.is_dir() else {}
  if not sources:
    raise FileNotFoundError(
      f"{name}: no source files in {source_path}; expected {expected_files(name)} "
      "(see es_jax/data/builders.py for where to download them)."
    )
  target = base / source_key(source_path)
  want = fingerprint(sources, source_dir=source_path)
  # TFDS warns about a builder on a missing directory: look only when it is there.
  builder = _builder(cls, target) if target.is_dir() else None
  if builder is not None and builder.is_prepared():
    if builder.info.metadata.get("sources") == want:
      return builder
    log.info("%s: source files in %s changed; preparing again", name, source_path)
  base.mkdir(parents=True, exist_ok=True)
  tmp = base / f".tmp-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  log.info("%s: preparing the files of %s (nothing is downloaded)", name, source_path)
  bars = tfds.core.utils.tqdm_utils
  shown = getattr(bars, "_active", True)  # TFDS's global switch, restored below
  try:
    tfds.display_progress_bar(shown and progress and sys.stderr.isatty())
    _builder(cls, tmp).download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        manual_dir=str(source_path),
        download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS,
        try_download_gcs=False,
      )
    )
    _publish(tmp, target, want)
  finally:
    tfds.display_progress_bar(shown)
    shutil.rmtree(tmp, ignore_errors=True)
  log.info("%s: prepared into %s", name, target)
  return _builder(cls, target)


def to_python(value: Any) -> Any:
  """TFDS values (bytes, NumPy scalars and arrays, lists) as str / int / float / list."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray | list | tuple):
    return [to_python(v) for v in value]
  if isinstance(value, np.generic):
    return value.item() if not isinstance(value, np.bytes_) else value.decode("utf-8")
  if isinstance(value, dict):
    return {k: to_python(v) for k, v in value.items()}
  return value
