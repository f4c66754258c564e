"""Preemption: a SIGTERM (a TPU preemption, `stop.sh`) becomes a flag a training loop polls.

The process no longer dies on the signal: the loop finishes the current step, saves and returns
normally (exit 0). One flag spans a whole run (`sigterm_scope`, from `experiments.main`'s start
through the final evaluation), so a signal seen in any stage is still set when the next stage or
evaluation asks (`preempted`). With several processes, any host's signal stops every host.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

_log = logging.getLogger(__name__)


class PreemptionHandler:
  """A signal flag a training loop polls: finish the step, save, exit 0.

  Installed by `install_sigterm_handler` (or `sigterm_scope`, which reuses the one an enclosing
  scope installed, so one flag spans a whole run); a context manager that puts the previous
  handlers back on exit (or call `uninstall()`).

  Attributes:
    requested: True once one of the signals arrived in this process.
    signum: the last signal received, or None.
  """

  def __init__(self, signals: tuple[int, ...]):
    self.requested = False
    self.signum: int | None = None
    self._signals = tuple(signals)
    self._previous: dict[int, Any] = {}

  def _handle(self, signum, frame) -> None:
    del frame
    self.requested, self.signum = True, signum
    _log.warning("Received signal %d: will save and stop after the current step.", signum)

  def install(self) -> PreemptionHandler:
    if threading.current_thread() is not threading.main_thread():
      raise RuntimeError(
        "install_sigterm_handler must be called from the main thread (Python delivers signals "
        "there only); call it in main() before starting the training loop."
      )
    for s in self._signals:
      self._previous[s] = signal.signal(s, self._handle)
    _ACTIVE.append(self)
    return self

  def uninstall(self) -> None:
    """Puts back the handlers that were installed before."""
    for s, previous in self._previous.items():
      signal.signal(s, previous if previous is not None else signal.SIG_DFL)
    self._previous.clear()
    if self in _ACTIVE:
      _ACTIVE.remove(self)

  def should_stop(self) -> bool:
    """`requested` agreed over all processes (any host's signal stops every host).

    Call it at the same point of every step on every process: with several processes it is a
    collective (an all-gather of one flag).
    """
    if jax.process_count() == 1:
      return self.requested
    flags = multihost_utils.process_allgather(np.int32(self.requested))
    return bool(np.any(flags))

  def __enter__(self) -> PreemptionHandler:
    return self

  def __exit__(self, *exc) -> None:
    self.uninstall()


def install_sigterm_handler(
  signals: tuple[int, ...] = (signal.SIGTERM,),
) -> PreemptionHandler:
  """Replaces the handlers of `signals` (default SIGTERM, a TPU preemption) with a flag.

  The process no longer dies on the signal; the loop checks `handler.requested` (or
  `should_stop()` on several hosts) after each step, saves and returns normally.

    with install_sigterm_handler() as preempt:
      for step in range(start, num_steps):
        state = train_step(state)
        if preempt.should_stop():
          ckpt.save(step + 1, state=state, force=True)
          break

  Args:
    signals: the signal numbers to catch.

  Returns:
    The installed `PreemptionHandler`, also a context manager restoring the previous handlers.
  """
  return PreemptionHandler(signals).install()


_ACTIVE: list[PreemptionHandler] = []  # installed handlers, innermost last


def active_handler() -> PreemptionHandler | None:
  """The innermost installed `PreemptionHandler`, or None."""
  return _ACTIVE[-1] if _ACTIVE else None


def preempted() -> bool:
  """Whether the run's SIGTERM flag (`sigterm_scope`) is set, on any host.

  False outside a scope. A collective with several processes: call it at the same point on all.
  """
  handler = active_handler()
  return handler is not None and handler.should_stop()


@contextlib.contextmanager
def sigterm_scope(signals: tuple[int, ...] = (signal.SIGTERM,)):
  """The handler an enclosing scope installed, else a new one installed for this block.

  A run wraps everything it does (startup, every stage, the final evaluation) in one scope, so
  a signal seen at any moment is still set when the next stage or evaluation asks.
  """
  if _ACTIVE:
    yield _ACTIVE[-1]
    return
  with install_sigterm_handler(signals) as handler:
    yield handler
