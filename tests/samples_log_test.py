"""Tests for experiments.infra.samples_log: the training completions' rows, samples.jsonl and its
TensorBoard text (the final evaluation's samples file: evaluate_test)."""

import json

import numpy as np
import pytest
from logger_test import _events
from tiny_models import tiny_tokenizer

from es_jax import data
from es_jax.decode import sampling
from es_jax.es import population
from es_jax.grpo.loss import group_advantages
from experiments.infra import samples_log
from experiments.infra.logger import SAMPLES_FILE, RunLogger

P, T = 3, 6


@pytest.fixture(scope="module")
def tok():
  return tiny_tokenizer()


def _examples():
  return [{"id": i, "prompt": f"Add {i} and 1.", "answer": str(i + 1)} for i in range(P)]


def _completions(tok, texts):
  """Host Completions [*, T] of the given texts (masked after each), as a rollout returns."""
  ids = [tok.encode(t, add_special_tokens=False)[:T] for t in texts]
  tokens = np.full((len(ids), T), tok.pad_token_id, np.int32)
  mask = np.zeros((len(ids), T), bool)
  for r, row in enumerate(ids):
    tokens[r, : len(row)], mask[r, : len(row)] = row, True
  zeros = np.zeros((len(ids), T), np.float32)
  return sampling.Completions(tokens, zeros, zeros, mask, mask.sum(1).astype(np.int32))


def test_es_rows_go_from_the_best_and_worst_members_inwards(tok):
  n = 4
  texts = [f"m{m}p{p}" for m in range(n) for p in range(P)]
  flat = _completions(tok, texts)
  completions = sampling.Completions(*(x.reshape(n, P, *x.shape[1:]) for x in flat))  # [N, P, T]
  rewards = np.arange(n * P, dtype=np.float32).reshape(n, P) % 5 / 4  # [N, P]
  fitness = np.array([0.5, 0.9, 0.1, np.nan], np.float32)  # NaN ranks worst
  stats = population.PopulationStats(
    rewards, np.zeros(n), np.zeros(n), np.arange(n, dtype=np.int32), completions
  )
  rows = samples_log.es_rows(tok, _examples(), fitness, stats, count=5)
  assert [(r["member"], r["prompt_index"]) for r in rows] == [
    (1, 0),
    (3, 1),
    (0, 2),
    (2, 0),
    (1, 2),
  ]
  for r in rows:
    assert r["completion"] == f"m{r['member']}p{r['prompt_index']}"
    assert r["reward"] == rewards[r["member"], r["prompt_index"]]
    assert r["prompt"] == data.format_prompt(_examples()[r["prompt_index"]], tok)
  assert rows[0]["fitness"] == pytest.approx(0.9) and np.isnan(rows[1]["fitness"])
  # More than N·P asked: each (member, prompt) once.
  every = samples_log.es_rows(tok, _examples(), fitness, stats, count=100)
  assert len({(r["member"], r["prompt_index"]) for r in every}) == len(every) == n * P


def test_grpo_rows_take_the_widest_group_first_with_its_advantages(tok):
  g = 2
  rewards = np.array([[1.0, 1.0], [0.0, 1.0], [0.2, 0.5]], np.float32)  # [P, G]
  texts = [f"p{p}g{j}" for p in range(P) for j in range(g)]
  rows = samples_log.grpo_rows(
    tok, _examples(), _completions(tok, texts), rewards, std="population", count=3
  )
  assert [(r["prompt_index"], r["generation"]) for r in rows] == [(1, 0), (1, 1), (2, 0)]
  advantages = np.asarray(group_advantages(rewards, std="population")[0])
  for r in rows:
    p, j = r["prompt_index"], r["generation"]
    assert r["completion"] == f"p{p}g{j}" and r["reward"] == rewards[p, j]
    assert r["advantage"] == pytest.approx(advantages[p, j])
  assert rows[0]["advantage"] < 0 < rows[1]["advantage"]


def _rows(count, tag="x"):
  return [
    {"method": "es", "completion": f"{tag}{i}\nline 2", "reward": float("nan")}
    for i in range(count)
  ]


@pytest.mark.slow
def test_train_samples_every_k_steps_resume_and_tensorboard(tmp_path):
  with RunLogger(tmp_path, resume_step=-1) as logger:
    samples = samples_log.TrainSamples(logger, every=2, count=2, resume_step=-1)
    calls = []
    for step in range(1, 6):
      samples.log(step, lambda count: calls.append(count) or _rows(count), stage="1_es")
  assert calls == [2, 2]  # rows are made only at the due steps 2 and 4
  lines = [json.loads(ln) for ln in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
  assert [ln["step"] for ln in lines] == [2, 2, 4, 4]
  assert lines[0]["stage"] == "1_es" and lines[0]["reward"] is None  # NaN: null, strict JSON
  texts = [
    (e.step, v.tensor.string_val[0].decode())
    for e in _events(tmp_path)
    for v in e.summary.value
    if v.tag.startswith("samples")
  ]
  assert [s for s, _ in texts] == [2, 4] and "    x0\n    line 2" in texts[0][1]
  # Resumed from the checkpoint of step 2: step 4's lines go, step 4 logs again.
  with RunLogger(tmp_path, resume_step=2) as logger:
    samples = samples_log.TrainSamples(logger, every=2, count=1, resume_step=2)
    samples.log(4, lambda count: _rows(count, "again"))
  lines = [json.loads(ln) for ln in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
  assert [(ln["step"], ln["completion"][:6]) for ln in lines] == [
    (2, "x0\nlin"),
    (2, "x1\nlin"),
    (4, "again0"),
  ]
  # A stage's first and last step (edge) are due whatever `every` says; others are not.
  with RunLogger(tmp_path / "edge", resume_step=-1) as logger:
    samples = samples_log.TrainSamples(logger, every=10, count=1, resume_step=-1)
    assert samples.due(1, edge=True) and samples.due(8, edge=True) and samples.due(10)
    assert not samples.due(3) and not samples.due(8)
  # every=0 or count=0: never due, no file.
  off = RunLogger(tmp_path / "off", resume_step=-1)
  assert not samples_log.TrainSamples(off, every=0, count=4, resume_step=-1).due(10, edge=True)
  assert not samples_log.TrainSamples(off, every=1, count=0, resume_step=-1).due(10)
  off.close()
  assert not (tmp_path / "off" / SAMPLES_FILE).exists()
