"""Tests for es_jax.persist.preemption: the SIGTERM flag, one per run, restored handlers."""

import os
import signal
import threading
import time

from es_jax.persist.preemption import active_handler, install_sigterm_handler, sigterm_scope


def test_sigterm_sets_flag_and_restores_handler():
  previous = signal.getsignal(signal.SIGTERM)
  with install_sigterm_handler() as preempt:
    assert not preempt.requested and not preempt.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not preempt.requested and time.monotonic() < deadline:
      time.sleep(0.01)  # the handler runs on the main thread between bytecodes
    assert preempt.requested and preempt.should_stop()
    assert preempt.signum == signal.SIGTERM
  # Still alive here, and the previous handler is back.
  assert signal.getsignal(signal.SIGTERM) == previous


def test_sigterm_scope_is_one_flag_for_nested_scopes():
  previous = signal.getsignal(signal.SIGTERM)
  assert active_handler() is None
  with sigterm_scope() as outer:
    with sigterm_scope() as inner:  # e.g. a stage inside a run: the same flag
      assert inner is outer and active_handler() is outer
      assert not outer.requested  # nothing sent yet
      os.kill(os.getpid(), signal.SIGTERM)
      deadline = time.monotonic() + 5
      while not outer.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    # The inner scope ended; the flag and the handler are still the run's.
    assert outer.requested and signal.getsignal(signal.SIGTERM) == outer._handle
  assert active_handler() is None and signal.getsignal(signal.SIGTERM) == previous


def test_sigterm_handler_refuses_other_threads():
  errors = []

  def target():
    try:
      install_sigterm_handler()
    except RuntimeError as err:
      errors.append(err)

  thread = threading.Thread(target=target)
  thread.start()
  thread.join()
  assert errors and "main thread" in str(errors[0])
