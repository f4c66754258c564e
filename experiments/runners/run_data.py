"""A run's randomness and data: named key streams, the data order, prompt encoding and scoring.

Keys. `run_keys(seed)` splits `jax.random.key(seed)` into named streams, so no two uses share a
key: `noise` (ES step keys, `fold_in(noise, global_step)`), `sample` (sampled decoding in ES and
GRPO rollouts, `fold_in(sample, global_step)`), `eval` (every evaluation) and `init` (random
models). Steps are global (a sequential run counts across stages), so each step's randomness
depends on nothing but the seed and the step.

Data order. Step s (global) uses examples `order[s·P .. s·P + P)` of an endless stream made of
one permutation of the pool per epoch (a fixed function of seed and epoch; the file order when
shuffle is off). The data position of a checkpoint is therefore its step times P; nothing else
needs saving. A sequential run's second stage continues the stream where the first stopped
(docs/method.md §4 does not say; this choice reuses no prompt before an epoch ends).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from es_jax import data, rewards
from es_jax.decode import sampling
from es_jax.rewards.user import DEFAULT_TIMEOUT_S as DEFAULT_REWARD_TIMEOUT_S
from experiments import fields
from experiments.schema import check as config_check
from experiments.schema.check import check

KEY_STREAMS = ("noise", "sample", "eval", "init")


def run_keys(seed: int) -> dict[str, jax.Array]:
  """The named key streams of a run (module docstring)."""
  keys = jax.random.split(jax.random.key(int(seed)), len(KEY_STREAMS))
  return dict(zip(KEY_STREAMS, keys, strict=True))


def _task_kwargs(section: Mapping[str, Any], field: str) -> dict[str, Any]:
  task = section.get("task") or ""
  check(bool(task), f"{field}.task", task, "name a task (es_jax.data.TASKS or reasoning_gym/...)")
  task_config = dict(section.get("task_config") or {}) or None
  return dict(
    name=task,
    task_config=task_config,
    on_bad_row=section.get("on_bad_row") or "raise",
  )


def file_options(data_section: Mapping[str, Any]) -> dict[str, Any]:
  """The question/answer file settings of config.data, for `load_examples` of task "file"
  (config.eval's file task reads them too)."""
  return dict(
    question_field=data_section.get("question_field") or "question",
    answer_field=data_section.get("answer_field") or "answer",
    prompt_template=data_section.get("prompt_template") or "",
    reward=data_section.get("reward") or "",
  )


def load_examples(
  section: Mapping[str, Any],
  field: str,
  *,
  limit: int | None = None,
  options: Mapping[str, Any] | None = None,
):
  """The examples of config.data or config.eval (`field` names the section in errors); task
  "file" reads `section["path"]` with `options` (`file_options`); `section["progress"]` (default
  True) shows TFDS's bars while a dataset is prepared."""
  limit = section.get("limit") if limit is None else limit
  if section.get("task") == data.FILE_TASK:
    path = section.get("path") or ""
    check(bool(path), f"{field}.path", path, "task 'file' needs your question/answer file")
    try:
      with config_check.user_errors(f"config.{field}.path"):
        return data.load_file_task(
          path, limit=limit, on_bad_row=section.get("on_bad_row") or "raise", **(options or {})
        )
    except config_check.ConfigError as e:
      if isinstance(e.__cause__, data.ColumnError):  # the fields are config.data's (file_options)
        c = e.__cause__
        raise config_check.ConfigError(
          f"config.data.{c.option}={c.value!r}: {path} has no such field in its first row; its "
          f"fields are {c.present}: pick one with --config.data.{c.option}"
        ) from c
      raise
  kwargs = _task_kwargs(section, field)
  split = section.get("split") or ""
  check(bool(split), f"{field}.split", split, "name a split")
  with config_check.user_errors(f"config.{field}"):
    files = data.DataFiles(
      section.get("data_dir") or None,
      section.get("source_dir") or None,
      bool(section.get("progress", fields.default("progress"))),
    )
    examples = data.load_task(split=split, files=files, limit=limit, **kwargs)
  check(len(examples) > 0, f"{field}.limit", limit, f"the task {kwargs['name']!r} gave no example")
  return examples


def reward_name(section: Mapping[str, Any]) -> str:
  return section.get("reward") or section.get("task")


def reward_options(data_section: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
  """The options of reward `name` (default: config.data's): a user's reward (module:function)
  gets its time limit, `data.reward_timeout`; the library's rewards take their defaults."""
  if not rewards.is_user_reward(name or reward_name(data_section)):
    return {}
  return {"timeout_s": float(data_section.get("reward_timeout") or DEFAULT_REWARD_TIMEOUT_S)}


def load_reward(data_section: Mapping[str, Any], name: str, examples: Sequence[dict]) -> Callable:
  """The reward `name` with `reward_options`; a user's reward is imported in its worker and
  called once, on `examples[0]` with an empty completion, so that a reward that cannot be
  imported or breaks its contract (es_jax.rewards.user) fails before any model loads.

  Raises:
    ConfigError: naming config.data.reward, in one line.
  """
  with config_check.user_errors("config.data.reward"):
    reward = rewards.get_reward(name, **reward_options(data_section, name))
    if isinstance(reward, rewards.UserReward) and len(examples):
      reward("", examples[0])
  return reward


def eval_correct_fn(
  data_section: Mapping[str, Any], name: str, examples: Sequence[dict]
) -> Callable[[str, dict], bool] | None:
  """Evaluation's correctness for a user's reward `name`, imported and checked now
  (`load_reward`) and called with config.data's time limit; None for a library reward (the
  evaluation's default, `rewards.is_correct`)."""
  if not rewards.is_user_reward(name):
    return None
  load_reward(data_section, name, examples)
  return functools.partial(rewards.is_correct, task=name, **reward_options(data_section, name))


def batch_indices(num_examples: int, *, step: int, batch: int, seed: int, shuffle: bool):
  """Indices into the pool of the `batch` examples of global step `step` (module docstring)."""
  positions = np.arange(step * batch, (step + 1) * batch, dtype=np.int64)
  epochs, within = np.divmod(positions, num_examples)
  out = np.empty(batch, np.int64)
  for epoch in np.unique(epochs):
    if shuffle:
      order = np.random.default_rng([int(seed), int(epoch)]).permutation(num_examples)
    else:
      order = np.arange(num_examples)
    sel = epochs == epoch
    out[sel] = order[within[sel]]
  return out


def encode_examples(tokenizer, examples: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
  """Chat-formatted, tokenised, left-padded prompts [P, S] (bucketed lengths)."""
  texts = [data.format_prompt(ex, tokenizer) for ex in examples]
  return sampling.encode_prompts(tokenizer, texts)


def decode_layout(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`config.decode` as `sampling.Decoding`'s kv_chunk (None for 0: dense reads) and compactions."""
  return dict(
    kv_chunk=int(config.decode.kv_chunk) or None, compactions=int(config.decode.compactions)
  )


def section_decoding(
  section: ml_collections.ConfigDict, eos_ids: tuple[int, ...], pad_id: int, layout=None
) -> sampling.Decoding:
  """`sampling.Decoding` from a method's section (config.es or config.grpo: max_new_tokens,
  temperature, top_p), the tokenizer's stop and pad tokens and `layout` (`decode_layout`); its
  checks raise ValueError, which each runner names in its own section's terms."""
  return sampling.Decoding(
    int(section.max_new_tokens),
    float(section.temperature),
    float(section.top_p),
    eos_ids,
    pad_id,
    **(layout or {}),
  )


def eos_ids(tokenizer) -> tuple[int, ...]:
  ids = {tokenizer.eos_token_id}
  return tuple(sorted(i for i in ids if i is not None))


def make_scorer(
  tokenizer, reward: Callable[[str, dict], float]
) -> Callable[[np.ndarray, np.ndarray, Sequence[dict]], np.ndarray]:
  """`score(tokens [R, T], mask [R, T], examples [R]) -> rewards [R]` on decoded completions.

  Rewards come from es_jax.rewards (no model output is executed in-process).
  """

  def score(tokens, mask, examples):
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    out = np.empty(len(examples), np.float32)
    for r, ex in enumerate(examples):
      text = tokenizer.decode(tokens[r][mask[r]], skip_special_tokens=True)
      out[r] = reward(text, ex)
    return out

  return score


def examples_source(examples: Sequence[dict]) -> dict[str, Any]:
  """Where a training or evaluation pool comes from (`TaskExamples.source`), or its length."""
  return dict(getattr(examples, "source", None) or {"used": len(examples)})


def samples_per_step(config: ml_collections.ConfigDict, method: str) -> int:
  """Completions generated by one training step: N·P for ES, P·G for GRPO (docs/method.md §1, §3).

  Logged cumulatively as `train/samples`, an equal-compute x-axis for ES and GRPO curves.
  """
  per_prompt = config.es.population_size if method == "es" else config.grpo.num_generations
  return int(config.data.prompts_per_step) * int(per_prompt)


def step_batch(ctx: Any, global_step: int) -> tuple[list[dict], np.ndarray, np.ndarray]:
  """The examples and encoded prompts of a global step.

  `ctx` is an `experiments.runners.run_context.Context` (its `examples`, `tokenizer` and `config`);
  not imported for the annotation, since run_context imports this module.
  """
  idx = batch_indices(
    len(ctx.examples),
    step=global_step,
    batch=int(ctx.config.data.prompts_per_step),
    seed=int(ctx.config.seed),
    shuffle=bool(ctx.config.data.shuffle),
  )
  examples = [ctx.examples[int(i)] for i in idx]
  ids, mask = encode_examples(ctx.tokenizer, examples)
  return examples, ids, mask
