"""What the model wrote: the final evaluation's completions and a few training completions.

For reading raw outputs next to their scores, e.g. to debug a reward's answer parser.

Final evaluation (`EvalSamples`): the first `eval.keep_samples` problems of each task, one line
per problem in `<eval dir>/<label>.samples.jsonl`:

  {"index", "id", "prompt", "gold", "greedy": {"completion", "answer", "correct"},
   "samples": [{"completion", "answer", "correct"}, ...]}         (n samples, in sample order)

"prompt" is the text the model was given (chat template applied), "gold" the example's "answer"
field (null without one), "answer" the reward's extraction (`es_jax.rewards.answer_key`, the
answer Maj@k votes on; null where the reward has none: code, your own function) and "correct"
the evaluation's verdict (1/0). A line is written before its problem's record in
`<label>.jsonl`; a resumed evaluation cuts a torn last line and skips the problems already in the
file, so no line is written twice.

Training (`TrainSamples`): every `log_samples_every` global steps, `log_samples` completions with
their rewards, one line each in `<workdir>/samples.jsonl` and as TensorBoard text ("samples"):

  ES    {"step", "stage", "method": "es", "member", "fitness", "prompt_index", "prompt",
         "completion", "reward"}: members from the best and the worst fitness inwards, each on
         the next prompt of the step's batch
  GRPO  {"step", "stage", "method": "grpo", "prompt_index", "generation", "prompt", "completion",
         "reward", "advantage"}: whole groups, the widest reward spread first

A resumed run drops the lines past its checkpoint's step, as metrics.jsonl does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from es_jax import data
from es_jax.grpo.loss import group_advantages
from experiments.evaluation import results as eval_results
from experiments.infra.logger import SAMPLES_FILE, RunLogger, drop_lines_after, to_json_value

TEXT_FIELDS = ("texts", "greedy_text")  # what `eval_sampler.BlockScorer` adds to scored samples


def _gold(example: Mapping[str, Any]) -> Any:
  value = example.get("answer")
  try:
    return to_json_value(value, name="answer")
  except TypeError:
    return str(value)


class EvalSamples:
  """Writes `<label>.samples.jsonl` for the first `keep` problems (module docstring)."""

  def __init__(
    self,
    path: str | None,
    *,
    keep: int,
    prompt_fn: Callable[[dict], str],
    resume: bool,
    save_text: bool = False,
  ):
    """Opens the file.

    Args:
      path: the samples file; None writes nothing (an evaluation kept in memory).
      keep: how many problems (the first by index) get a line; 0 = none.
      prompt_fn: example -> the prompt text the model was given.
      resume: keep the problems already in the file; False deletes it first.
      save_text: `take` leaves the texts in the scored samples (for the records).
    """
    self.path, self.keep, self.prompt_fn, self.save_text = path, int(keep), prompt_fn, save_text
    self.written: set[int] = set()
    if path is None:
      return
    if not resume and os.path.exists(path):
      os.remove(path)
    if self.keep > 0:
      self.written = {r["index"] for r in eval_results.read_records(path, repair=True)}

  def take(self, index: int, example: Mapping[str, Any], scored: dict) -> dict:
    """Writes problem `index`'s line when it is kept and not written yet; returns `scored`
    without its texts unless `save_text`."""
    if self.path is not None and index < self.keep and index not in self.written:
      sampled = zip(scored["texts"], scored["answers"], scored["correct"], strict=True)
      line = {
        "index": index,
        "id": eval_results.example_id(example, index),
        "prompt": self.prompt_fn(example),
        "gold": _gold(example),
        "samples": [{"completion": t, "answer": a, "correct": int(c)} for t, a, c in sampled],
      }
      if "greedy" in scored:
        correct, answer, _ = scored["greedy"]
        line["greedy"] = {
          "completion": scored["greedy_text"],
          "answer": answer,
          "correct": int(bool(correct)),
        }
      eval_results.append_record(self.path, line)
      self.written.add(index)
    if self.save_text:
      return scored
    return {k: v for k, v in scored.items() if k not in TEXT_FIELDS}


def _decode(tokenizer, tokens: np.ndarray, mask: np.ndarray) -> str:
  return tokenizer.decode(np.asarray(tokens)[np.asarray(mask, bool)], skip_special_tokens=True)


def es_rows(tokenizer, examples: Sequence[dict], fitness, stats, *, count: int) -> list[dict]:
  """`count` ES completions of one step: members from the best and the worst fitness inwards
  (among this host's `stats.local_members`), member j on prompt j mod P (then the next prompts).

  Args:
    tokenizer: decodes the completions.
    examples: the step's P examples.
    fitness: [N] the members' fitness.
    stats: the step's `es_jax.es.population.PopulationStats` (rewards [N, P], completions [n, P,
      T]).
    count: how many completions.
  """
  local = [int(m) for m in stats.local_members]
  score = np.nan_to_num(np.asarray(fitness, np.float64)[local], nan=-np.inf)
  order = list(np.argsort(-score, kind="stable"))  # rows of `completions`, best first
  picks = [order[i // 2] if i % 2 == 0 else order[-1 - i // 2] for i in range(len(order))]
  num_prompts, rows, seen = len(examples), [], set()
  for j in range(min(count, len(picks) * num_prompts)):
    row, p = int(picks[j % len(picks)]), (j + j // len(picks)) % num_prompts
    if (row, p) in seen:
      continue
    seen.add((row, p))
    member = local[row]
    rows.append(
      {
        "method": "es",
        "member": member,
        "fitness": float(fitness[member]),
        "prompt_index": p,
        "prompt": data.format_prompt(examples[p], tokenizer),
        "completion": _decode(
          tokenizer, stats.completions.tokens[row, p], stats.completions.mask[row, p]
        ),
        "reward": float(stats.rewards[member, p]),
      }
    )
  return rows


def grpo_rows(
  tokenizer, examples: Sequence[dict], completions, rewards, *, std: str | None, count: int
) -> list[dict]:
  """`count` GRPO rows of one step with their rewards and advantages (`es_jax.grpo.loss.
  group_advantages` with the run's `std`): whole groups, the widest reward spread first.

  Args:
    tokenizer: decodes the completions.
    examples: the step's P examples.
    completions: host `Completions` of the rollout, row p·G + g (tokens, mask [P·G, T]).
    rewards: [P, G] the rows' rewards.
    std: the advantage normalisation of the run (config.grpo.advantage_std, resolved).
    count: how many rows.
  """
  rewards = np.asarray(rewards, np.float32)
  group = rewards.shape[1]
  advantages = np.asarray(group_advantages(rewards, std=std)[0])  # [P, G]
  spread = np.nan_to_num(np.ptp(rewards, axis=1), nan=np.inf)
  rows = []
  for p in np.argsort(-spread, kind="stable"):
    for g in range(group):
      if len(rows) == count:
        return rows
      r = int(p) * group + g
      rows.append(
        {
          "method": "grpo",
          "prompt_index": int(p),
          "generation": g,
          "prompt": data.format_prompt(examples[int(p)], tokenizer),
          "completion": _decode(tokenizer, completions.tokens[r], completions.mask[r]),
          "reward": float(rewards[p, g]),
          "advantage": float(advantages[p, g]),
        }
      )
  return rows


def _markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """The rows as TensorBoard markdown: a heading line each, the completion as a code block."""
  parts = []
  for r in rows:
    facts = [f"{k} {r[k]:.4g}" if isinstance(r[k], float) else f"{k} {r[k]}" for k in r]
    head = " · ".join(f for f, k in zip(facts, r, strict=True) if k not in ("prompt", "completion"))
    body = "\n".join("    " + line for line in (r["completion"] or "(empty)").splitlines())
    parts.append(f"**{head}**\n\n{body or '    (empty)'}")
  return "\n\n".join(parts)


class TrainSamples:
  """samples.jsonl and TensorBoard text of a training stage (module docstring)."""

  def __init__(self, logger: RunLogger, *, every: int, count: int, resume_step: int | None):
    """Opens `samples.jsonl` next to the logger's metrics.jsonl.

    Args:
      logger: the stage's logger (its directory, TensorBoard writer and process-0 rule).
      every: log at global steps divisible by this; 0 = never.
      count: completions per logged step.
      resume_step: as `RunLogger`'s: lines past it are dropped; None keeps them all.
    """
    self.logger, self.every, self.count = logger, int(every), int(count)
    self.path = None
    if logger.enabled and self.every > 0 and self.count > 0:
      self.path = epath.Path(logger.local_dir) / SAMPLES_FILE
      drop_lines_after(self.path, resume_step)

  def due(self, step: int, *, edge: bool = False) -> bool:
    """Whether global step `step` logs samples (on this process): every `every` steps, and the
    first and last step of a stage (`edge`), so a short run has its completions too."""
    return self.path is not None and (edge or step % self.every == 0)

  def log(
    self, step: int, rows: Callable[..., list[dict]], *, stage: str | None = None, edge=False
  ) -> None:
    """Appends the rows `rows(count)` makes (called only when `due(step, edge=edge)`) at global
    `step`."""
    if not self.due(step, edge=edge):
      return
    made = [{k: to_json_value(v, name=k) for k, v in r.items()} for r in rows(count=self.count)]
    with open(self.path, "a", encoding="utf-8") as f:  # non-finite numbers are null (strict JSON)
      for r in made:
        line = {"step": int(step), "stage": stage, **r}
        f.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
    self.logger.text("samples", _markdown(made), step)
