"""TFDS builders that read the datasets' original files from a local directory.

One builder per dataset (`BUILDERS`) names the files each split is read from (`SPLIT_FILES`,
relative to the source directory: the first matching pattern wins, several matches are read in
sorted order; a split is prepared when one of its patterns matches), its task-specific features,
and its row format (`formats.PARSERS[name]`). `es_jax.data.prepared` runs them: it prepares a
source directory's files into array_record files and finds the prepared copies.

Bad rows never stop preparation and are never dropped silently: every bad row is recorded, with
file, line and field, in the prepared dataset's metadata ("bad_rows", "num_bad_rows"), so the
reader can raise on them or skip and count them, whichever the caller asks for; the prepared
files do not depend on that choice. The metadata also keeps a SHA-256 fingerprint of the source
files: preparing again from changed files rebuilds the dataset, identical files reuse it.

Downloads (any of the listed file names works):
  gsm8k       github.com/openai/grade-school-math grade_school_math/data/{train,test}.jsonl,
              or huggingface.co/datasets/openai/gsm8k main/{train,test}-*.parquet
  deepscaler  huggingface.co/datasets/agentica-org/DeepScaleR-Preview-Dataset deepscaler.json
  math500     huggingface.co/datasets/HuggingFaceH4/MATH-500 test.jsonl
  aime24      test.jsonl / aime24.jsonl / *.parquet (e.g. HuggingFaceH4/aime_2024)
  aime25      test.jsonl / aime25.jsonl / aime2025*.jsonl (opencompass/AIME2025)
  amc23       test.jsonl / amc23.jsonl / *.parquet (e.g. math-ai/amc23, AI-MO/aimo-validation-amc)
  countdown   {train,test}.jsonl or *.parquet (e.g. Jiayi-Pan/Countdown-Tasks-3to4)
  csqa        CommonsenseQA train_rand_split.jsonl, dev_rand_split.jsonl (split "validation")
  hotpotqa    hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json (split "validation")
  gpqa        gpqa_diamond.csv, gpqa_main.csv, gpqa_extended.csv (splits diamond / main / extended)
  mbpp        mbpp.jsonl (splits by task id: prompt 1-10, test 11-510, validation 511-600,
              train 601-974), sanitized-mbpp.json, or {split}.jsonl
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import tensorflow_datasets as tfds

from es_jax.data import formats
from es_jax.data.readers import SUFFIXES, BadRowError, FieldError, read_rows

log = logging.getLogger(__name__)
MAX_STORED_BAD_ROWS = 1000  # per split; the count is always exact


def _text():
  return tfds.features.Text()


def _texts():
  return tfds.features.Sequence(tfds.features.Text())


class LocalFileBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the local-file builders: subclasses give `name`, `SPLIT_FILES` and extra features.

  The row format of each dataset lives in `formats.PARSERS[name]`.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Read from the original local files."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Download the original files once; see es_jax/data/builders.py."
  SPLIT_FILES: ClassVar[dict[str, tuple[str, ...]]] = {}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    # TFDS looks here for a download-checksums file. Its own lookup imports
    # `importlib_resources`, which tensorflow-datasets 4.9.10 does not install, and nothing is
    # downloaded here, so there is no file to find.
    return None

  # TFDS prints "Downloading and preparing dataset ..." and "... downloaded and prepared" to
  # stdout; nothing is downloaded here (the files are local): `prepare` logs its own lines.
  _log_download_bytes = _log_download_done = lambda self: None  # noqa: E731

  def extra_features(self) -> dict[str, Any]:
    """Task-specific features stored next to "id", "question" and "answer"."""
    return {"solution": _text()}

  def keep_row(self, *, split: str, path: Path, row: dict) -> bool:
    """Whether a row of `path` belongs to `split` (for files that hold several splits)."""
    del split, path, row
    return True

  def _info(self) -> tfds.core.DatasetInfo:
    features = {"id": _text(), "question": _text(), "answer": _text(), **self.extra_features()}
    return tfds.core.DatasetInfo(
      builder=self,
      description=f"{self.name}, read from the original local files by es_jax.data.",
      features=tfds.features.FeaturesDict(features),
      disable_shuffling=True,  # Keep file order: ids and evaluation order stay reproducible.
      metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager):
    source_dir = Path(dl_manager.manual_dir)
    sources = find_sources(type(self), source_dir)
    self.info.metadata["sources"] = fingerprint(sources, source_dir=source_dir)
    self.info.metadata["source_dir"] = str(source_dir)
    self.info.metadata["bad_rows"], self.info.metadata["num_bad_rows"] = {}, {}
    generators, first_bad = {}, None
    for split, paths in sources.items():
      examples, bad = self._parse_split(split=split, paths=paths)
      self.info.metadata["bad_rows"][split] = [b.to_dict() for b in bad[:MAX_STORED_BAD_ROWS]]
      self.info.metadata["num_bad_rows"][split] = len(bad)
      first_bad = first_bad or (bad[0] if bad else None)
      if examples:
        generators[split] = self._generate_examples(examples=examples)
      else:  # TFDS cannot write an empty split; the reader reports it from the metadata.
        log.warning("%s: split %r has no valid rows in %s", self.name, split, paths)
    if not generators:
      if first_bad is not None:
        raise first_bad
      raise ValueError(f"{self.name}: no rows in any of {sorted(sources.items())}")
    return generators

  def _parse_split(self, *, split: str, paths: list[Path]):
    parse = formats.PARSERS[self.name]
    examples, bad, index = [], [], 0
    for path in paths:
      unit, rows = read_rows(path)
      for line, row in rows:
        if isinstance(row, FieldError):
          bad.append(
            BadRowError(path=str(path), line=line, unit=unit, field=row.field, reason=row.reason)
          )
          continue
        if not self.keep_row(split=split, path=path, row=row):
          continue
        try:
          examples.append((index, parse(row, fallback_id=f"{split}-{index}")))
        except FieldError as e:
          bad.append(
            BadRowError(path=str(path), line=line, unit=unit, field=e.field, reason=e.reason)
          )
        index += 1
    return examples, bad

  def _generate_examples(self, examples):
    yield from examples


class Gsm8k(LocalFileBuilder):
  """GSM8K (Cobbe et al. 2021): grade-school word problems, gold after '####'."""

  name = "gsm8k"
  SPLIT_FILES: ClassVar = {
    s: (f"{s}.jsonl", f"main/{s}-*.parquet", f"{s}-*.parquet") for s in ("train", "test")
  }


class Deepscaler(LocalFileBuilder):
  """DeepScaleR-Preview (40,315 competition problems): problem / solution / answer."""

  name = "deepscaler"
  SPLIT_FILES: ClassVar = {"train": ("deepscaler.json", "train.jsonl", "train.json")}


class Math500(LocalFileBuilder):
  """MATH-500 (Lightman et al. 2023 subset of MATH)."""

  name = "math500"
  SPLIT_FILES: ClassVar = {"test": ("test.jsonl", "math500.jsonl")}

  def extra_features(self):
    return {"solution": _text(), "subject": _text(), "level": np.int64}


class Aime24(LocalFileBuilder):
  """AIME 2024, 30 problems with integer answers."""

  name = "aime24"
  SPLIT_FILES: ClassVar = {
    "test": ("test.jsonl", "aime24.jsonl", "aime_2024*.jsonl", "*.parquet", "data/*.parquet")
  }


class Aime25(LocalFileBuilder):
  """AIME 2025 (I and II), 30 problems with integer answers."""

  name = "aime25"
  SPLIT_FILES: ClassVar = {
    "test": ("test.jsonl", "aime25.jsonl", "aime2025*.jsonl", "*.parquet", "data/*.parquet")
  }


class Amc23(LocalFileBuilder):
  """AMC 2023, 40 problems."""

  name = "amc23"
  SPLIT_FILES: ClassVar = {"test": ("test.jsonl", "amc23.jsonl", "*.parquet", "data/*.parquet")}


class Countdown(LocalFileBuilder):
  """Countdown: reach `target` with each of `nums` used once (TinyZero / Qiu et al. format)."""

  name = "countdown"
  SPLIT_FILES: ClassVar = {
    "train": ("train.jsonl", "countdown.jsonl", "train-*.parquet", "data/train-*.parquet"),
    "test": ("test.jsonl",),
  }

  def extra_features(self):
    return {"nums": tfds.features.Sequence(np.int64), "target": np.int64}


class Csqa(LocalFileBuilder):
  """CommonsenseQA (Talmor et al. 2019), five options labelled A-E."""

  name = "csqa"
  SPLIT_FILES: ClassVar = {
    "train": ("train_rand_split.jsonl", "train.jsonl"),
    "validation": ("dev_rand_split.jsonl", "validation.jsonl", "dev.jsonl"),
  }

  def extra_features(self):
    return {"choices": _texts()}


class Gpqa(LocalFileBuilder):
  """GPQA (Rein et al. 2023); options are shuffled per row when read, not when prepared."""

  name = "gpqa"
  SPLIT_FILES: ClassVar = {s: (f"gpqa_{s}.csv",) for s in ("diamond", "main", "extended")}

  def extra_features(self):
    return {"incorrect_answers": _texts(), "domain": _text()}


class Hotpotqa(LocalFileBuilder):
  """HotpotQA (Yang et al. 2018), distractor setting; context stored as JSON text."""

  name = "hotpotqa"
  SPLIT_FILES: ClassVar = {
    "train": ("hotpot_train_v1.1.json", "train.json"),
    "validation": ("hotpot_dev_distractor_v1.json", "validation.json"),
  }

  def extra_features(self):
    return {"context": _text(), "type": _text(), "level": _text()}


_MBPP_TASK_IDS = {
  "prompt": (1, 10),
  "test": (11, 510),
  "validation": (511, 600),
  "train": (601, 974),
}
_MBPP_COMBINED = ("mbpp.jsonl", "sanitized-mbpp.json")


class Mbpp(LocalFileBuilder):
  """MBPP (Austin et al. 2021): Python problems with assert tests."""

  name = "mbpp"
  SPLIT_FILES: ClassVar = {
    s: (f"{s}.jsonl", *_MBPP_COMBINED, f"full/{s}-*.parquet") for s in _MBPP_TASK_IDS
  }

  def extra_features(self):
    return {
      "task_id": np.int64,
      "test_list": _texts(),
      "test_setup_code": _text(),
      "challenge_test_list": _texts(),
    }

  def keep_row(self, *, split, path, row):
    if path.name not in _MBPP_COMBINED:
      return True
    try:
      task_id = int(row["task_id"])
    except (KeyError, TypeError, ValueError):
      return True  # The parser reports the bad id.
    low, high = _MBPP_TASK_IDS[split]
    return low <= task_id <= high


BUILDERS: dict[str, type[LocalFileBuilder]] = {
  cls.name: cls
  for cls in (
    Gsm8k,
    Deepscaler,
    Math500,
    Aime24,
    Aime25,
    Amc23,
    Countdown,
    Csqa,
    Gpqa,
    Hotpotqa,
    Mbpp,
  )
}


def find_sources(builder_cls: type[LocalFileBuilder], source_dir: Path) -> dict[str, list[Path]]:
  """Maps each split to its source files under `source_dir` (splits without files are absent)."""
  sources = {}
  for split, patterns in builder_cls.SPLIT_FILES.items():
    for pattern in patterns:
      paths = sorted(p for p in source_dir.glob(pattern) if p.is_file() and p.suffix in SUFFIXES)
      if paths:
        sources[split] = paths
        break
  return sources


def fingerprint(sources: dict[str, list[Path]], *, source_dir: Path) -> dict[str, list]:
  """{split: [[path relative to source_dir, sha256 of its bytes], ...]} (JSON-serialisable)."""
  result = {}
  for split, paths in sources.items():
    result[split] = []
    for path in paths:
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for chunk in iter(lambda f=f: f.read(1 << 20), b""):
          digest.update(chunk)
      result[split].append([path.relative_to(source_dir).as_posix(), digest.hexdigest()])
  return result


def expected_files(name: str) -> str:
  """A readable list of the file patterns each split of `name` is read from."""
  return "; ".join(f"{s}: {' | '.join(p)}" for s, p in BUILDERS[name].SPLIT_FILES.items())
