"""Reading the datasets' original files row by row, with the location of every row.

Each reader yields `(location, row)` pairs in file order, where `location` is the 1-based line of
the row's start (JSONL, JSON lists, CSV) or its 1-based row number (Parquet), and `row` is the
parsed mapping or a `FieldError` when the row itself cannot be used: invalid JSON, not an object,
bytes that are not UTF-8, a lone surrogate escape ("\\ud800"), nesting too deep to parse, or an
integer with more digits than Python converts (`sys.get_int_max_str_digits`, 4300 by default).
Turning a row into an example, and deciding whether a bad row raises or is skipped, is the
caller's business; readers never drop a row.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_WHITESPACE = re.compile(r"[ \t\n\r]*")
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


class FieldError(ValueError):
  """A row lacks a field, or the field's value cannot be used; raised by the row parsers.

  Attributes:
    field: the field's name as it appears in the file ("question.stem", "answer", "<row>").
    reason: what was wrong, and what the value should look like.
  """

  def __init__(self, field: str, reason: str):
    super().__init__(f"field '{field}': {reason}")
    self.field = field
    self.reason = reason


class BadRowError(ValueError):
  """A bad row of a source file, located by file, line (or row) and field.

  Attributes:
    path: the source file.
    line: 1-based line where the row starts (1-based row number for Parquet files).
    unit: "line" or "row", the meaning of `line`.
    field: the offending field.
    reason: what was wrong.
    hint: what to do about it (appended to the message).
  """

  def __init__(
    self, *, path: str, line: int, field: str, reason: str, unit: str = "line", hint: str = ""
  ):
    message = f"{path}, {unit} {line}: field '{field}': {reason}"
    if hint:
      message = f"{message}. {hint}"
    super().__init__(message)
    self.path = path
    self.line = line
    self.unit = unit
    self.field = field
    self.reason = reason
    self.hint = hint

  def to_dict(self) -> dict[str, Any]:
    """A JSON-serialisable record of the bad row (stored with the prepared dataset)."""
    return {
      "path": self.path,
      "line": self.line,
      "unit": self.unit,
      "field": self.field,
      "reason": self.reason,
    }

  @classmethod
  def from_dict(cls, record: dict[str, Any], *, hint: str = "") -> BadRowError:
    """Rebuilds the error from `to_dict`'s record."""
    return cls(
      path=record["path"],
      line=record["line"],
      unit=record.get("unit", "line"),
      field=record["field"],
      reason=record["reason"],
      hint=hint,
    )


class _LongInt(str):
  """A JSON integer with more digits than `int()` accepts, kept as its text to be reported."""


def _parse_int(text: str) -> int | _LongInt:
  limit = sys.get_int_max_str_digits()
  if limit and len(text) - text.startswith("-") > limit:
    return _LongInt(text)
  return int(text)


def _bad_value(value: Any) -> str | None:
  """Why a parsed value cannot be stored, or None."""
  if isinstance(value, _LongInt):
    return f"an integer with {len(value.lstrip('-'))} digits (more than Python converts)"
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:
      code = ord(value[e.start])
      what = f"byte 0x{code - 0xDC00:02x} that is not UTF-8" if code >= 0xDC80 else "lone surrogate"
      return f"not valid UTF-8 text: a {what} (\\u{code:04x}) at character {e.start + 1}"
  return None


def _check_row(row: dict) -> dict | FieldError:
  """`row`, or a FieldError naming the first field holding unusable text or a huge integer."""
  stack: list[tuple[str, Any]] = [(str(k), v) for k, v in reversed(row.items())]
  while stack:  # iterative: values may nest deeply
    name, value = stack.pop()
    if isinstance(value, dict):
      stack.extend((f"{name}.{k}", v) for k, v in reversed(value.items()))
    elif isinstance(value, list):
      stack.extend((f"{name}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    else:
      if isinstance(name, str) and (reason := _bad_value(name)):
        return FieldError("<row>", f"a field name is {reason}")
      if reason := _bad_value(value):
        return FieldError(name, reason)
  return row


def _as_row(value: Any) -> Any:
  if isinstance(value, dict):
    return _check_row(value)
  return FieldError("<row>", f"expected a JSON object, got {type(value).__name__}")


def _loads(text: str) -> Any:
  """`json.loads`, huge integers kept as `_LongInt`; FieldError for what cannot be parsed."""
  try:
    return _as_row(json.loads(text, parse_int=_parse_int))
  except json.JSONDecodeError as e:
    return FieldError("<row>", f"invalid JSON ({e.msg} at column {e.colno})")
  except RecursionError:
    return FieldError("<row>", "JSON nested too deeply to parse")
  except ValueError as e:  # any other parse failure
    return FieldError("<row>", f"invalid JSON ({e})")


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
  """Yields `(line, row)` for each non-blank line of a JSON-lines file."""
  with open(path, "rb") as f:
    for line_number, raw in enumerate(f, start=1):
      if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        reason = f"not UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line"
        yield line_number, FieldError("<row>", reason)
        continue
      if not line.strip():
        continue
      yield line_number, _loads(line)


def read_json(path: Path) -> Iterator[tuple[int, Any]]:
  """Yields `(line, row)` for each element of a JSON list; a file of JSON lines also works.

  Raises:
    BadRowError: the list itself is malformed, so that no later row can be found (this cannot be
      skipped).
  """
  # Bytes that are not UTF-8 become lone surrogates, reported by the row they are in.
  text = Path(path).read_bytes().decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
  pos = _WHITESPACE.match(text, 0).end()
  if text.startswith("{", pos):  # Some ".json" downloads are JSON lines.
    yield from read_jsonl(path)
    return
  if not text.startswith("[", pos):
    raise BadRowError(
      path=str(path),
      line=text.count("\n", 0, pos) + 1,
      field="<file>",
      reason="expected a JSON list of objects (or JSON lines)",
    )
  decoder = json.JSONDecoder(parse_int=_parse_int)
  line, counted = 1, 0
  pos += 1
  while True:
    pos = _WHITESPACE.match(text, pos).end()
    line += text.count("\n", counted, pos)
    counted = pos
    if text.startswith("]", pos):
      return
    try:
      value, pos = decoder.raw_decode(text, pos)
    except json.JSONDecodeError as e:
      raise BadRowError(
        path=str(path),
        line=e.lineno,
        field="<row>",
        reason=f"invalid JSON ({e.msg} at column {e.colno}); the rest of the list cannot be read",
      ) from e
    except (RecursionError, ValueError) as e:
      why = "nested too deeply to parse" if isinstance(e, RecursionError) else f"invalid ({e})"
      raise BadRowError(
        path=str(path),
        line=line,
        field="<row>",
        reason=f"list element is {why}; the rest of the list cannot be read",
      ) from e
    yield line, _as_row(value)
    pos = _WHITESPACE.match(text, pos).end()
    if text.startswith(",", pos):
      pos += 1
    elif not text.startswith("]", pos):
      raise BadRowError(
        path=str(path),
        line=line + text.count("\n", counted, pos),
        field="<row>",
        reason="expected ',' or ']' after a list element",
      )


def _csv_error(path: Path, line: int, error: Exception) -> BadRowError:
  return BadRowError(
    path=str(path),
    line=line,
    field="<row>",
    reason=f"invalid CSV ({error}); the rest of the file cannot be read",
    hint="An unterminated quote runs into the next rows: close it, or write a quote in a quoted "
    'field as ""',
  )


def _width_error(row: dict, width: int) -> FieldError | None:
  """A FieldError when the record has more or fewer fields than the header, else None."""
  extra = len(row.get(None) or ())
  missing = sum(v is None for k, v in row.items() if k is not None)
  if not (extra or missing):
    return None
  return FieldError("<row>", f"{width + extra - missing} fields where the header has {width}")


def read_csv(path: Path) -> Iterator[tuple[int, Any]]:
  """Yields `(line, row)` for each record of a CSV file with a header (records may span lines).

  A record with more or fewer fields than the header is a bad row. A record that breaks the CSV
  syntax (an unterminated quote, text after a closing quote) raises BadRowError: where the
  following rows start cannot be known, so this cannot be skipped.
  """
  # Bytes that are not UTF-8 become lone surrogates, reported by the row they are in.
  with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
    reader = csv.DictReader(f, strict=True)
    try:
      width = len(reader.fieldnames or ())  # reads the header
    except csv.Error as e:
      raise _csv_error(path, 1, e) from None
    while True:
      start = reader.line_num + 1
      try:
        row = next(reader)
      except StopIteration:
        return
      except csv.Error as e:
        raise _csv_error(path, start, e) from None
      yield start, _width_error(row, width) or _check_row(row)


def _unreadable(path: Path, row_number: int, kind: str, error: Exception) -> BadRowError:
  return BadRowError(
    path=str(path),
    line=row_number,
    unit="row",
    field="<file>",
    reason=f"not a readable {kind} file ({type(error).__name__}: {error})",
  )


def read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
  """Yields `(row number, row)` for each row of a Parquet file (needs pyarrow); a file pyarrow
  cannot read raises BadRowError naming it."""
  try:
    import pyarrow as pa
    import pyarrow.parquet as pq
  except ImportError as e:
    raise ImportError(
      f"Reading {path} needs pyarrow (pip install pyarrow), or convert the file to JSON lines."
    ) from e
  row_number = 0
  try:
    for batch in pq.ParquetFile(path).iter_batches():
      for row in batch.to_pylist():
        row_number += 1
        yield row_number, _check_row(row)
  except (pa.ArrowException, OSError, ValueError) as e:
    raise _unreadable(path, row_number + 1, "Parquet", e) from None


def arrow_dataset_files(path: Path) -> list[Path]:
  """The Arrow files of a directory written by Hugging Face `datasets`' `save_to_disk` (one
  split: `state.json` lists its `_data_files`), in order; ValueError for a DatasetDict directory
  (`dataset_dict.json`: name one split's subdirectory) or a directory of neither kind."""
  path = Path(path)
  if (path / "dataset_dict.json").exists():
    splits = sorted(p.name for p in path.iterdir() if (p / "state.json").exists())
    raise ValueError(f"{path} holds several splits {splits}: point the path at one of them.")
  state = path / "state.json"
  if not state.exists():
    raise ValueError(f"{path}: a directory without state.json is not a saved `datasets` split.")
  with open(state) as f:
    names = [d["filename"] for d in json.load(f).get("_data_files", [])]
  if not names:
    raise ValueError(f"{state}: no _data_files listed.")
  return [path / n for n in names]


def read_arrow_dataset(path: Path) -> Iterator[tuple[int, Any]]:
  """Yields `(row number, row)` for each row of a saved `datasets` split (Arrow streams, read
  with pyarrow; the `datasets` package itself is not needed)."""
  try:
    import pyarrow as pa
  except ImportError:
    raise ValueError(f"Reading {path} needs pyarrow (pip install pyarrow).") from None
  row_number = 0
  for file in arrow_dataset_files(path):
    try:
      with pa.memory_map(str(file)) as source:
        for batch in pa.ipc.open_stream(source):
          for row in batch.to_pylist():
            row_number += 1
            yield row_number, _check_row(row)
    except (pa.ArrowException, OSError, ValueError) as e:
      raise _unreadable(file, row_number + 1, "Arrow", e) from None


def read_rows(path: Path) -> tuple[str, Iterator[tuple[int, Any]]]:
  """Picks the reader by file suffix (a directory: a saved `datasets` split); returns
  `(unit, rows)` with unit "line" or "row"."""
  if Path(path).is_dir():
    arrow_dataset_files(path)  # a bad directory fails here, before any row
    return "row", read_arrow_dataset(path)
  suffix = Path(path).suffix
  if suffix == ".jsonl":
    return "line", read_jsonl(path)
  if suffix == ".json":
    return "line", read_json(path)
  if suffix == ".csv":
    return "line", read_csv(path)
  if suffix == ".parquet":
    return "row", read_parquet(path)
  raise ValueError(f"{path}: unsupported file type '{suffix}'; expected one of {SUFFIXES}")
