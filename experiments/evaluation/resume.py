"""Before a run writes anything: may its final evaluation resume the one saved in WORKDIR/eval?

A final evaluation resumes problem by problem (experiments.evaluation.evaluate), and only under the
settings its `<task>.meta.json` files recorded: samples drawn with other settings (eval.refill,
eval.num_samples, the seed, ...) must not be mixed in. `prepare` checks this when the run starts,
before config.json or anything else is written, so that a refused attempt changes no file; with
`eval.restart` it moves the saved evaluation aside instead (eval.stale-<n>, nothing deleted).
The params a saved evaluation scored are checked once training ends (`set_aside_stale`): a
finished run resumed with a larger num_steps evaluates its new params.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from es_jax.decode import sampling
from experiments.evaluation import data as eval_data
from experiments.evaluation import results as eval_results
from experiments.evaluation.tasks import EvalSettings, TaskSpec
from experiments.schema.errors import ConfigError

log = logging.getLogger(__name__)

# A settings-file key -> the config field that sets it (others: eval.<key>).
_FIELDS = {"key": "seed", "label": "eval.task", "task": "eval.task", "greedy": "eval (greedy)"}
_FIELDS.update(eos_ids="model (its stop tokens)", pad_id="model (its pad token)")


def sample_decoding(settings: EvalSettings, tokenizer) -> sampling.Decoding:
  """`settings.decoding` with the tokenizer's pad token, and its EOS unless the settings give
  stop tokens."""
  eos_ids = settings.decoding.eos_ids
  if not eos_ids:
    eos_ids = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
  return settings.decoding.replace(eos_ids=eos_ids, pad_id=sampling.pad_id(tokenizer))


def task_meta(task: TaskSpec, settings: EvalSettings, decoding, key, run_info) -> dict:
  """The sampling settings and problems (`eval_data.problem_counts`) of `<label>.meta.json`; a
  resume with other values is refused (other problems included). `decoding`: the settings'
  with the tokenizer's stop and pad tokens."""
  return {
    "label": task.label,
    "task": task.task,
    **eval_data.problem_counts(task),
    "num_samples": settings.num_samples,
    "temperature": 0.0 if decoding.greedy else float(decoding.temperature),
    "top_p": 1.0 if decoding.top_p is None else float(decoding.top_p),
    "max_new_tokens": decoding.max_new_tokens,
    "batch_size": settings.batch_size,
    "greedy": bool(settings.greedy),
    "eos_ids": list(decoding.eos_ids),
    "pad_id": decoding.pad_id,
    "key": eval_results.key_json(key),
    "run_info": json.loads(json.dumps(run_info)) if run_info else None,
    # only when on, so that evaluations saved before the field existed still resume
    **({"refill": True} if settings.refill else {}),
  }


def saved_differences(evaluator: Any, eval_dir: str) -> list[str]:
  """ "<field> (<saved> saved, <value> now)" for every setting of the final evaluation
  (`evaluate.Evaluator.final`) that differs from the one saved in `eval_dir`; the params it
  scored (run_info) are left out."""
  settings = evaluator.settings(int(evaluator.config.num_samples))
  decoding = sample_decoding(settings, evaluator.tokenizer)
  out = []
  for spec in [evaluator.main, *evaluator.extra]:
    path = eval_results.file_stem(eval_dir, spec.label) + ".meta.json"
    if not os.path.exists(path):
      continue
    with open(path) as f:
      saved = json.load(f)
    now = task_meta(spec, settings, decoding, evaluator.key, None)
    now = json.loads(json.dumps(now))
    for k in sorted((set(saved) | set(now)) - {"run_info"}):
      if saved.get(k) != now.get(k):
        name = _FIELDS.get(k, f"eval.{k}")
        out.append(f"{name} ({saved.get(k)!r} saved, {now.get(k)!r} now)")
  return list(dict.fromkeys(out))


def move_aside(eval_dir: str) -> str | None:
  """Renames `eval_dir` to eval.stale-<n> (the first free n); returns the new path, or None when
  there is no `eval_dir`."""
  if not os.path.isdir(eval_dir):
    return None
  n = 1
  while os.path.exists(f"{eval_dir}.stale-{n}"):
    n += 1
  os.replace(eval_dir, f"{eval_dir}.stale-{n}")
  return f"{eval_dir}.stale-{n}"


def prepare(evaluator: Any, eval_dir: str, *, restart: bool) -> None:
  """Refuses a saved evaluation in `eval_dir` made with other settings; with `restart`, moves
  `eval_dir` aside instead (the evaluation starts over).

  Raises:
    ConfigError: one line naming the differing fields and how to start over.
  """
  if restart:
    moved = move_aside(eval_dir)
    if moved:
      log.info("eval.restart: moved the saved evaluation %s to %s", eval_dir, moved)
    return
  diff = saved_differences(evaluator, eval_dir)
  if diff:
    raise ConfigError(
      f"{eval_dir} holds an evaluation made with other settings: {'; '.join(diff)}. Rerun with "
      "the saved values to resume it, or add --config.eval.restart=True to start it over (the "
      "saved one is moved to eval.stale-<n>)."
    )


def set_aside_stale(eval_dir: str, run_info: Mapping[str, Any]) -> str | None:
  """Moves `eval_dir` aside (`move_aside`) when its records were computed for other params than
  `run_info` says (for example a finished run resumed with a larger num_steps); returns the new
  path, or None when the records are current or absent. Nothing is deleted."""
  if not os.path.isdir(eval_dir):
    return None
  current = json.loads(json.dumps(dict(run_info)))
  for name in sorted(os.listdir(eval_dir)):
    if not name.endswith(".meta.json"):
      continue
    with open(os.path.join(eval_dir, name)) as f:
      saved = json.load(f).get("run_info")
    if saved != current:
      stale = move_aside(eval_dir)
      message = "%s holds the evaluation of other params (%s); moved to %s, evaluating these"
      log.warning(message, eval_dir, saved, stale)
      return stale
  return None
