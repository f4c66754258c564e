"""experiments.reports.plots: Pass@k and metric-over-steps figures, their y range, EMA smoothing and
the errors for bad series."""

import os

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from experiments.reports import plots


def test_plots_write_pngs_and_reject_bad_series(tmp_path):
  curves = {
    "base": ([1, 2, 4, 8], [0.2, 0.3, 0.4, 0.5]),
    "ES": ([1, 2, 4, 8], [0.25, 0.4, 0.5, 0.6]),
  }
  assert os.path.getsize(plots.plot_pass_at_k(curves, tmp_path / "a.png")) > 1000
  steps = np.arange(20)
  series = {"ES": (steps, np.sin(steps)), "GRPO": (steps, np.where(steps % 5, steps, np.nan))}
  path = plots.plot_metric_over_steps(
    series, tmp_path / "b" / "c.png", ylabel="reward", smoothing=3
  )
  assert os.path.getsize(path) > 1000
  np.testing.assert_allclose(plots.moving_average([1, 2, np.nan, 4], 2), [1, 1.5, 2, 4])
  with pytest.raises(ValueError, match="no series"):
    plots.plot_pass_at_k({}, tmp_path / "d.png")
  with pytest.raises(ValueError, match="'x'"):
    plots.plot_metric_over_steps({"x": ([1, 2], [1])}, tmp_path / "e.png", ylabel="y")
  with pytest.raises(ValueError, match=r"boundaries for \['GRPO'\], which have no series"):
    plots.metric_figure({"ES": (steps, steps)}, ylabel="y", boundaries={"GRPO": [2.5]})


def test_metric_plot_ticks_are_whole_steps_values_plain_and_stages_marked():
  """Three steps of a reward that moves by 1e-4: integer step ticks, no axis offset (which
  would show the 1e-4 noise as 1-to-3 swings), one dotted line per stage boundary."""
  fig = plots.metric_figure(
    {"GRPO→ES": ([1, 2, 3], [1.0001, 1.0002, 1.0003])}, ylabel="r", boundaries={"GRPO→ES": [1.5]}
  )
  FigureCanvasAgg(fig).draw()
  (ax,) = fig.axes
  ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
  assert ticks and all(float(t).is_integer() for t in ticks), ticks
  assert ax.yaxis.get_major_formatter().get_offset() == ""
  dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
  assert len(dotted) == 1 and list(dotted[0].get_xdata()) == [1.5, 1.5]
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert legend == ["GRPO→ES", "GRPO→ES: stage switch"]  # the boundary is in the legend


def test_flat_series_draws_flat_and_a_moving_one_keeps_its_range():
  """0.15625 at both steps (and float32 noise around it) spans at least MIN_Y_SPAN: no zoom
  into noise; a real change keeps matplotlib's own range."""
  for values in ([0.15625, 0.15625], [0.15625, 0.15625 + 3e-8]):
    fig = plots.metric_figure({"ES": ([1, 2], values)}, ylabel="r")
    lo, hi = fig.axes[0].get_ylim()
    assert hi - lo >= plots.MIN_Y_SPAN * 0.999 and lo < 0.15625 < hi
  fig = plots.metric_figure({"ES": ([1, 2], [0.1, 0.6])}, ylabel="r")
  lo, hi = fig.axes[0].get_ylim()
  assert lo <= 0.1 and 0.6 <= hi < 0.7  # unchanged: the data's own margins


def test_reward_plot_smooths_with_a_debiased_ema_and_keeps_every_line_findable():
  """Raw values faint under a debiased EMA; coinciding curves differ in style and width."""
  np.testing.assert_allclose(plots.debiased_ema([2.0, 2.0, 2.0], 0.9), [2.0, 2.0, 2.0])
  # m_2 = (0.5·0.5·1 + 0.5·3) / (1 - 0.25) with m_1 = 1: the first value is not pulled to 0.
  np.testing.assert_allclose(plots.debiased_ema([1.0, np.nan, 3.0], 0.5), [1.0, 1.0, 7 / 3])
  assert np.isnan(plots.debiased_ema([np.nan, 1.0], 0.5)[0])
  steps = [1, 2, 3, 4]
  same = [0.0, 1.0, 0.0, 1.0]
  fig = plots.metric_figure(
    {"ES": (steps, same), "GRPO": (steps, same), "ES→GRPO": (steps, same)}, ylabel="r", ema=0.6
  )
  (ax,) = fig.axes
  shown = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
  assert set(shown) == {"ES", "GRPO", "ES→GRPO"}
  styles = {(str(ln.get_linestyle()), ln.get_linewidth()) for ln in shown.values()}
  assert len(styles) == 3  # none hides another
  np.testing.assert_allclose(shown["GRPO"].get_ydata(), plots.debiased_ema(same, 0.6))
  faint = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")]
  assert len(faint) == 3 and all(ln.get_alpha() < 0.5 for ln in faint)
  assert list(faint[0].get_ydata()) == same  # the raw values, faint
  with pytest.raises(ValueError, match="ema must be in"):
    plots.metric_figure({"ES": (steps, same)}, ylabel="r", ema=1.0)
