"""The batch layout of an evaluation: which rows go in which generate call, with which key.

Problems go in blocks of `batch_size`. A block is one greedy batch (its problems, padded to
`batch_size` rows with copies of the last) and ⌈P·n / batch_size⌉ sampled batches holding its rows
problem-major (row = problem · n + sample), padded likewise. All batches of a block share one
bucketed prompt length, so every generate call is [batch_size, S] and the number of compiles is
the number of prompt-length buckets. Sampled batch j of block b draws with key
fold_in(block_key, j), block_key = fold_in(task_key, b): each sample is a fixed function of
(task key, problem index, sample index, batch_size), whatever ran before. A batch holding only
finished problems is skipped; any other batch is recomputed whole, with the same rows and key, so
a resumed evaluation draws exactly the samples of an uninterrupted one. A sampled batch prefills
each of its problems' prompts once (`Decoding.prefill_rows`: `problems_per_batch` rows), not once
per sample.

With `refill` on, a block's samples are one queue instead (`es_jax.decode.queue.generate_queue`:
the block's P·n sample rows through `batch_size` rows, a row refilled with the next waiting sample
as its completion ends, so the decode steps follow the tokens generated rather than each batch's
longest completion). Sample s of problem p draws with its own key fold_in(block_key, p·n + s),
so it does not depend on batch_size either. The queue always holds batch_size · n items (one
compile per prompt-length bucket); the padding items and those of finished problems get a budget
of one token. Resuming recomputes a block's unfinished problems only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import numpy as np

from es_jax import models
from es_jax.decode.queue import generate_queue
from es_jax.decode.sampling import Decoding, generate, pad_prompts


def _resolve(params, config):
  """(params dict, ModelConfig) from a params dict, a Transformer, or a zero-argument loader."""
  if callable(params) and not isinstance(params, (models.Transformer, Mapping)):
    params = params()
  if isinstance(params, models.Transformer):
    return models.params(params), params.config
  if config is None:
    raise ValueError("evaluate: pass `config=` (a ModelConfig) when giving a params dict.")
  return params, config


def _answer(value) -> str | None:
  return None if value is None else value if isinstance(value, str) else str(value)


def problems_per_batch(batch_size: int, n: int) -> int:
  """The most problems a sampled batch of `batch_size` problem-major rows (n per problem) holds:
  its rows' prompts are prefilled once per problem (`Decoding.prefill_rows`), the same count for
  every batch so that all compile one program."""
  starts = {j * batch_size % n for j in range(n)}  # a batch's first row within its problem
  return min(batch_size, max((s + batch_size - 1) // n + 1 for s in starts))


class BlockScorer:
  """Generates and scores the batches of one block of problems (layout: the module docstring).
  Sampled rows decode with `decoding`; the greedy ones with it at temperature 0."""

  def __init__(
    self,
    params,
    config,
    tokenizer,
    *,
    n,
    batch_size,
    decoding: Decoding,
    greedy,
    prompt_fn,
    correct_fn,
    answer_fn,
    refill=False,
  ):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.refill = bool(refill)
    self.n, self.batch_size, self.decoding = n, batch_size, decoding
    self.greedy = greedy
    self.prompt_fn, self.correct_fn, self.answer_fn = prompt_fn, correct_fn, answer_fn
    self.calls = self.new_tokens = 0
    self._resolved = None

  def _generate(self, ids, mask, key, decoding, **queue):
    """Completions of the rows (with `queue`: `generate_queue`'s rows and max_tokens; `key`
    then holds one key per row)."""
    if self._resolved is None:  # a loader runs only once some problem is left to do
      self._resolved = _resolve(self.params, self.config)
    params, config = self._resolved
    run = functools.partial(generate_queue, **queue) if queue else generate
    out = run(params, ids, mask, decoding, key=key, config=config)
    tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)  # [B, T]
    self.calls, self.new_tokens = self.calls + 1, self.new_tokens + int(mask.sum())
    return tokens, mask, np.asarray(out.entropy, np.float64)

  def _decode(self, tokens, mask, rows):
    return self.tokenizer.batch_decode([tokens[r][mask[r]] for r in rows], skip_special_tokens=True)

  def score_block(self, examples, block: range, done: set[int], block_key):
    """Yields (problem index, scored samples) for the unfinished problems of `block`, in order;
    the decoded texts are in "texts" and "greedy_text" (`samples_log.EvalSamples.take` keeps
    or drops them)."""
    exs = [examples[i] for i in block]
    encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
    ids, mask = pad_prompts(
      [encode(self.prompt_fn(ex)) for ex in exs], pad_id=self.decoding.pad_id
    )  # [P, S]
    todo = [p for p, i in enumerate(block) if i not in done]
    acc = {
      p: {"correct": [], "answers": [], "lengths": [], "entropy": 0.0, "texts": []} for p in todo
    }
    last = len(exs) - 1
    if self.greedy:
      rows = np.minimum(np.arange(self.batch_size), last)
      greedy = self.decoding.replace(temperature=0.0)
      tokens, out_mask, _ = self._generate(ids[rows], mask[rows], block_key, greedy)
      for p, text in zip(todo, self._decode(tokens, out_mask, todo), strict=True):
        acc[p]["greedy"] = (
          self.correct_fn(text, exs[p]),
          _answer(self.answer_fn(text)),
          int(out_mask[p].sum()),
        )
        acc[p]["greedy_text"] = text
    batches = self._queue if self.refill else self._batches
    for live, problem, (tokens, out_mask, entropy) in batches(ids, mask, acc, block_key):
      for r, text in zip(live, self._decode(tokens, out_mask, live), strict=True):
        a = acc[int(problem[r])]
        a["correct"].append(int(bool(self.correct_fn(text, exs[problem[r]]))))
        a["answers"].append(_answer(self.answer_fn(text)))
        a["lengths"].append(int(out_mask[r].sum()))
        a["entropy"] += float(np.sum(entropy[r] * out_mask[r]))
        a["texts"].append(text)
      for p in [p for p in acc if len(acc[p]["correct"]) == self.n]:
        yield block[p], acc.pop(p)

  def _batches(self, ids, mask, acc, block_key):
    """Yields (live rows, problem of each row, generate's output) per sampled batch that holds
    an unfinished problem's sample."""
    num_rows, last = ids.shape[0] * self.n, ids.shape[0] - 1
    shared = self.decoding.replace(prefill_rows=problems_per_batch(self.batch_size, self.n))
    for j in range(-(-num_rows // self.batch_size)):
      row_ids = np.arange(j * self.batch_size, (j + 1) * self.batch_size)
      problem = np.minimum(row_ids // self.n, last)  # [B] padding rows repeat the last problem
      live = [r for r in range(self.batch_size) if row_ids[r] < num_rows and problem[r] in acc]
      if live:
        key = jax.random.fold_in(block_key, j)
        yield live, problem, self._generate(ids[problem], mask[problem], key, shared)

  def _queue(self, ids, mask, acc, block_key):
    """The block's samples as one queue (module docstring): yields (live rows, problem of
    each row, the queue's output) once, if some problem is unfinished."""
    W, num_rows = self.batch_size * self.n, ids.shape[0] * self.n
    row_ids = np.arange(W)
    problem = np.minimum(row_ids // self.n, ids.shape[0] - 1)
    live = [r for r in range(W) if r < num_rows and problem[r] in acc]
    if live:
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(block_key, row_ids)
      budget = self.decoding.max_new_tokens
      queue = dict(rows=self.batch_size, max_tokens=np.where(np.isin(row_ids, live), budget, 1))
      yield live, problem, self._generate(ids[problem], mask[problem], keys, self.decoding, **queue)
