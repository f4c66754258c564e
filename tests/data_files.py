"""Fixture-file helpers of the data tests (tests/data_test.py, tests/data_builders_test.py)."""

import json

from es_jax import data


def write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")
  return path


def jsonl(rows):
  return "".join(json.dumps(r) + "\n" for r in rows)


def load(tmp_path, name, split, progress=True, **kwargs):
  files = data.DataFiles(str(tmp_path / "tfds"), str(tmp_path / "src"), progress)
  return data.load_task(name, split, files=files, **kwargs)


GSM8K_ROWS = [
  {"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
  {"question": "How many?", "answer": "Lots.\n#### 1,234"},
  {"question": "Half of 7?", "answer": "#### -3.5"},
]
