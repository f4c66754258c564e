"""PNG plots shared by the runners: Pass@k against k for several methods, a metric over steps.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no global backend
state), so plotting works headless and from threads. Each function writes one PNG and returns its
path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Series = tuple[Sequence[float], Sequence[float]]
# Line styles cycled with the colours, so that runs whose curves coincide (a sequential run's
# first stage repeats the single-method run) stay findable; ":" is kept for stage boundaries.
LINESTYLES = ("-", "--", "-.", (0, (8, 2, 2, 2, 2, 2)))
# The smallest y range of a metric plot, relative to max(1, |centre|) (`_plain_y_axis`).
MIN_Y_SPAN = 0.02


def _checked(series: Mapping[str, Series], name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  if not series:
    raise ValueError(
      f"{name}: got no series to plot; pass {{label: (x, y)}} with one entry or more."
    )
  out = {}
  for label, pair in series.items():
    if len(pair) != 2:
      raise ValueError(f"{name}: series {label!r} must be an (x, y) pair, got {len(pair)} items.")
    x, y = (np.asarray(v, np.float64).reshape(-1) for v in pair)
    if x.shape != y.shape or x.size == 0:
      raise ValueError(
        f"{name}: series {label!r} needs equal, non-empty x and y, got {x.size} x and {y.size} y."
      )
    out[str(label)] = (x, y)
  return out


def _save(fig: Figure, path: str | os.PathLike) -> str:
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  return path


def plot_pass_at_k(
  curves: Mapping[str, Series],
  path: str | os.PathLike,
  *,
  title: str | None = None,
  percent: bool = True,
) -> str:
  """Pass@k against k, one line per method (or task), on a log2 k axis.

  Args:
    curves: label → (ks, pass@k values in [0, 1]), e.g. {"base": ..., "ES": ..., "GRPO": ...}.
    path: the PNG to write (parent directories are created).
    title: figure title.
    percent: label the y axis in percent (values are still given as fractions).

  Returns:
    The path written.
  """
  curves = _checked(curves, "plot_pass_at_k")
  all_k = np.unique(np.concatenate([k for k, _ in curves.values()]))
  if np.any(all_k < 1):
    raise ValueError(f"plot_pass_at_k: every k must be >= 1, got {all_k[all_k < 1].tolist()}.")
  fig = Figure(figsize=(6.0, 4.0))
  ax = fig.add_subplot()
  scale = 100.0 if percent else 1.0
  for label, (k, value) in curves.items():
    ax.plot(k, value * scale, marker="o" if k.size <= 12 else None, markersize=3, label=label)
  ax.set_xscale("log", base=2)
  top = int(all_k.max())
  ticks = sorted({2**e for e in range(int(math.log2(top)) + 1)} | {top})
  ax.set_xticks(ticks)
  ax.set_xticklabels([str(t) for t in ticks])
  ax.set_xlabel("k")
  ax.set_ylabel("Pass@k (%)" if percent else "Pass@k")
  ax.set_ylim(0.0, 1.02 * scale)
  ax.grid(True, alpha=0.3)
  ax.legend(loc="lower right")
  if title:
    ax.set_title(title)
  return _save(fig, path)


def metric_figure(
  series: Mapping[str, Series],
  *,
  ylabel: str,
  xlabel: str = "step",
  title: str | None = None,
  smoothing: int = 1,
  boundaries: Mapping[str, Sequence[float]] | None = None,
  ema: float | None = None,
  note: str | None = None,
) -> Figure:
  """The figure of `plot_metric_over_steps` (arguments the same, less the path).

  The x axis has integer ticks (steps, samples) and the y axis plain values, no offset (an
  offset makes noise of 1e-3 read as swings). Each series has its own colour and line style,
  and the first series is drawn widest, each later one narrower on top of it, so that
  coinciding curves stay visible.

  Args:
    series: label → (steps, values). NaN values leave gaps.
    ylabel: the metric's name.
    xlabel: the x axis' name.
    title: figure title.
    smoothing: window of a trailing moving average drawn over the raw values (1: none).
    boundaries: label → x positions of stage boundaries (a sequential run's switch from one
      method to the next), drawn as dotted vertical lines in that series' colour, in the legend
      as "<label>: stage switch".
    ema: in [0, 1): draw the debiased exponential moving average with this decay (`ema`)
      over the raw values, which are drawn faint; None: no EMA.
    note: a line of text under the axes (e.g. what makes two curves incomparable).

  Returns:
    The matplotlib Figure (not yet drawn).
  """
  series = _checked(series, "plot_metric_over_steps")
  if smoothing < 1:
    raise ValueError(f"plot_metric_over_steps: smoothing must be >= 1, got {smoothing}.")
  if ema is not None and not 0.0 <= ema < 1.0:
    raise ValueError(f"plot_metric_over_steps: ema must be in [0, 1), got {ema}.")
  unknown = sorted(set(boundaries or {}) - set(series))
  if unknown:
    raise ValueError(f"plot_metric_over_steps: boundaries for {unknown}, which have no series.")
  fig = Figure(figsize=(6.4, 4.4 if note else 4.0))
  ax = fig.add_subplot()
  count = len(series)
  # Each run's boundary lines span their own band of the height: runs switching at the same
  # step stay distinguishable.
  marked = [label for label in series if (boundaries or {}).get(label)]
  for i, (label, (step, value)) in enumerate(series.items()):
    style = dict(
      linestyle=LINESTYLES[i % len(LINESTYLES)],
      linewidth=1.3 + 1.7 * (count - 1 - i) / max(count - 1, 1),
    )
    if smoothing > 1:
      value_shown = moving_average(value, smoothing)
    elif ema is not None:
      value_shown = debiased_ema(value, ema)
    else:
      value_shown = None
    if value_shown is None:
      (line,) = ax.plot(step, value, label=label, **style)
    else:
      (line,) = ax.plot(step, value, alpha=0.25, linewidth=0.9)
      ax.plot(step, value_shown, color=line.get_color(), label=label, **style)
    for j, x in enumerate((boundaries or {}).get(label, ())):
      band = marked.index(label) / len(marked), (marked.index(label) + 1) / len(marked)
      switch = f"{label}: stage switch" if j == 0 else None
      ax.axvline(x, *band, color=line.get_color(), linestyle=":", linewidth=1.6, label=switch)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  _plain_y_axis(ax)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no overlap
  if title:
    ax.set_title(title)
  if note:
    fig.text(0.01, 0.005, note, fontsize="small", ha="left", va="bottom", wrap=True)
    fig.subplots_adjust(bottom=0.2)
  return fig


def _plain_y_axis(ax) -> None:
  """A y axis that never shows noise as swings: plain values (no offset) and a range of at least
  MIN_Y_SPAN x max(1, |centre|) around its centre, so a flat series (0.15625 at every step, or
  float32 noise of 1e-8 around it) draws flat, not across the whole height."""
  ax.ticklabel_format(axis="y", useOffset=False)
  lo, hi = ax.get_ylim()
  centre, span = (lo + hi) / 2, MIN_Y_SPAN * max(1.0, abs((lo + hi) / 2))
  if np.isfinite(centre) and hi - lo < span:
    ax.set_ylim(centre - span / 2, centre + span / 2)


def plot_metric_over_steps(
  series: Mapping[str, Series],
  path: str | os.PathLike,
  *,
  ylabel: str,
  xlabel: str = "step",
  title: str | None = None,
  smoothing: int = 1,
  boundaries: Mapping[str, Sequence[float]] | None = None,
  ema: float | None = None,
  note: str | None = None,
) -> str:
  """A metric over training steps (reward, entropy, drift...), one line per run, as a PNG at
  `path` (see `metric_figure` for the arguments); returns the path written."""
  fig = metric_figure(
    series,
    ylabel=ylabel,
    xlabel=xlabel,
    title=title,
    smoothing=smoothing,
    boundaries=boundaries,
    ema=ema,
    note=note,
  )
  return _save(fig, path)


def debiased_ema(values: Sequence[float], decay: float) -> np.ndarray:
  """Exponential moving average m_t = decay·m_{t-1} + (1 - decay)·x_t, divided by the weight
  1 - decay^t of the values seen (so the start is not pulled towards 0); NaNs are skipped
  (the average carries over them) and stay NaN until a first finite value."""
  values = np.asarray(values, np.float64)
  out = np.full(values.shape, np.nan)
  mean = weight = 0.0
  for t, x in enumerate(values):
    if np.isfinite(x):
      mean = decay * mean + (1.0 - decay) * x
      weight = decay * weight + (1.0 - decay)
    if weight > 0:
      out[t] = mean / weight
  return out


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing mean over the last `window` values (fewer at the start), ignoring NaNs."""
  values = np.asarray(values, np.float64)
  finite = np.isfinite(values)
  sums = np.cumsum(np.where(finite, values, 0.0))
  counts = np.cumsum(finite)
  sums[window:] = sums[window:] - sums[:-window]
  counts[window:] = counts[window:] - counts[:-window]
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def plot_pareto(
  points: Mapping[str, tuple[float, float, float, float]],
  path: str | os.PathLike,
  *,
  xlabel: str,
  ylabel: str,
  title: str | None = None,
  percent: bool = True,
) -> str:
  """One point per method with standard-error bars; the non-dominated points joined by a line.

  Args:
    points: label → (x, y, x standard error, y standard error), values in [0, 1]; a NaN standard
      error draws no bar.
    path: the PNG to write.
    xlabel: the x metric's name (e.g. "Pass@1").
    ylabel: the y metric's name (e.g. "Pass@32").
    title: figure title.
    percent: label the axes in percent (values are still given as fractions).

  Returns:
    The path written.
  """
  if not points:
    raise ValueError("plot_pareto: got no points; pass {label: (x, y, x_se, y_se)}.")
  for label, p in points.items():
    if len(p) != 4 or not all(math.isfinite(float(v)) for v in p[:2]):
      raise ValueError(f"plot_pareto: point {label!r} must be (x, y, x_se, y_se), x, y finite.")
  scale = 100.0 if percent else 1.0
  fig = Figure(figsize=(6.0, 4.5))
  ax = fig.add_subplot()
  for label, (x, y, xe, ye) in points.items():
    bars = {
      "xerr": None if not math.isfinite(float(xe)) else float(xe) * scale,
      "yerr": None if not math.isfinite(float(ye)) else float(ye) * scale,
    }
    ax.errorbar(float(x) * scale, float(y) * scale, fmt="o", capsize=3, label=label, **bars)
  front = pareto_front({k: (float(p[0]), float(p[1])) for k, p in points.items()})
  if len(front) > 1:
    xy = sorted((points[k][0] * scale, points[k][1] * scale) for k in front)
    ax.plot(*zip(*xy, strict=True), "--", color="gray", alpha=0.6, label="Pareto front")
  for values, set_lim in (
    ([p[0] for p in points.values()], ax.set_xlim),
    ([p[1] for p in points.values()], ax.set_ylim),
  ):
    if max(values) - min(values) < 1e-9:  # one value: a 10-point window, not matplotlib's ±5e-2
      centre = float(values[0]) * scale
      set_lim(max(centre - 0.05 * scale, -0.01 * scale), min(centre + 0.05 * scale, 1.01 * scale))
  ax.set_xlabel(f"{xlabel} (%)" if percent else xlabel)
  ax.set_ylabel(f"{ylabel} (%)" if percent else ylabel)
  ax.grid(True, alpha=0.3)
  ax.legend(loc="best", fontsize="small")
  if title:
    ax.set_title(title)
  return _save(fig, path)


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
  """Labels of the points no other point beats on both coordinates (larger is better)."""
  return [
    a
    for a, (xa, ya) in points.items()
    if not any(
      xb >= xa and yb >= ya and (xb > xa or yb > ya) for b, (xb, yb) in points.items() if b != a
    )
  ]
