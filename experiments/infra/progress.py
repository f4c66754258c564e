"""Progress for the terminal and the log: durations, one log line per training step with its
ETA, the counts at which a long loop logs its progress, a tqdm bar, and an evaluation's bar and
log lines (`EvalProgress`).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tqdm

log = logging.getLogger(__name__)


def format_seconds(seconds: float) -> str:
  """A duration for a log line: "42 s", "3 min 20 s", "2 h 05 min"."""
  if not math.isfinite(seconds):
    return "?"
  s = int(round(max(seconds, 0.0)))
  if s < 60:
    return f"{s} s"
  if s < 3600:
    return f"{s // 60} min {s % 60:02d} s"
  return f"{s // 3600} h {s % 3600 // 60:02d} min"


class StepTimer:
  """One log line per step, readable in a file: step, training reward, s/step and ETA.

  The ETA is the mean step time of this process (periodic evaluations and checkpoints included)
  times the steps left; a resumed run counts from its restored step.
  """

  def __init__(self, total: int, *, initial: int = 0, name: str = "train"):
    self.total, self.initial, self.name = int(total), int(initial), name
    self._t0 = time.perf_counter()

  def line(self, step: int, reward: float | None = None, step_seconds: float | None = None) -> str:
    """The line for local step `step` (1-based) just finished."""
    done = max(step - self.initial, 1)
    mean = (time.perf_counter() - self._t0) / done
    last = mean if step_seconds is None else step_seconds
    parts = [f"{self.name} step {step}/{self.total}"]
    if reward is not None:
      parts.append(f"train/reward {reward:.4f}")
    parts += [f"{last:.2f} s/step", f"ETA {format_seconds(mean * (self.total - step))}"]
    return " | ".join(parts)


def progress_marks(total: int, done: int, *, parts: int = 10) -> set[int]:
  """The counts (of `total`) at which to log progress: about every 1/`parts`, and the last one;
  counts up to `done` (already finished) are left out."""
  every = max(1, math.ceil(total / parts))
  return {n for n in (*range(every, total, every), total) if n > done}


class ProgressBar:
  """A tqdm bar with ETA; silent when stderr is not a terminal, when disabled, or off process 0."""

  def __init__(
    self,
    total: int,
    *,
    initial: int = 0,
    desc: str | None = None,
    enabled: bool | None = None,
    file: Any = None,
  ):
    """Starts the bar.

    Args:
      total: the number of steps of the run.
      initial: steps already done (a resumed run).
      desc: a label before the bar.
      enabled: force on or off; default: on when `file` (stderr) is a terminal, on process 0.
      file: where to draw; default sys.stderr.
    """
    file = file if file is not None else sys.stderr
    if enabled is None:
      enabled = bool(getattr(file, "isatty", lambda: False)()) and jax.process_index() == 0
    self.enabled, self._file = enabled, file
    kwargs = dict(unit="step", dynamic_ncols=True, mininterval=0.5)
    self._bar = tqdm.tqdm(
      total=total, initial=initial, desc=desc, file=file, disable=not enabled, **kwargs
    )

  def update(self, n: int = 1, **postfix: Any) -> None:
    """Advances by `n` steps and shows `postfix` (numbers shortened) after the bar."""
    if postfix:
      shown = {
        k: f"{v:.4g}" if isinstance(v, float | np.floating) else v for k, v in postfix.items()
      }
      self._bar.set_postfix(shown, refresh=False)
    self._bar.update(n)

  def write(self, message: str) -> None:
    """Prints a line without breaking the bar."""
    tqdm.tqdm.write(message, file=self._file)

  def close(self) -> None:
    self._bar.close()

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class EvalProgress:
  """An evaluation's tqdm bar, its log lines (with `log_progress`) and its time (`settings`: an
  `experiments.evaluation.tasks.EvalSettings`: progress, log_progress, num_samples)."""

  def __init__(self, label: str, total: int, done: int, settings: Any):
    self.label, self.total, self.done = label, total, done
    self.t0 = time.perf_counter()
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    self.bar = tqdm.tqdm(
      total=total, initial=done, desc=label, unit="problem", disable=not (settings.progress and tty)
    )
    self.marks = progress_marks(total, done) if settings.log_progress else set()
    if settings.log_progress and done < total:
      n = settings.num_samples
      log.info("eval %s: %d problems (%d done before), n = %d", label, total, done, n)

  def new(self, records: Mapping[int, dict]) -> int:
    """Problems evaluated by this call (not read back from the jsonl)."""
    return len(records) - self.done

  def update(self, records: Mapping[int, dict]) -> None:
    """One more problem done: Pass@1 so far on the bar, a log line at about every 10%."""
    pass_at_1 = np.mean([r["c"] / r["n"] for r in records.values()])
    self.bar.set_postfix_str(f"pass@1 {pass_at_1:.3f}", refresh=False)
    self.bar.update(1)
    if len(records) in self.marks:
      elapsed = time.perf_counter() - self.t0
      eta = elapsed / self.new(records) * (self.total - len(records))
      times = format_seconds(elapsed), format_seconds(eta)
      line = "eval %s: %d/%d problems | pass@1 %.3f | %s | ETA %s"
      log.info(line, self.label, len(records), self.total, pass_at_1, *times)

  def close(self) -> float:
    """Closes the bar; returns the seconds since the start."""
    self.bar.close()
    return time.perf_counter() - self.t0
