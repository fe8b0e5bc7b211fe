"""Pictures of learning: return curves read from a run's MLflow store, and the bench figures.

Reading (:func:`read_curves`: a run's metric history into :class:`Series`) and drawing
(:func:`draw_curves`, :func:`draw_curve_rows`, :func:`draw_bars`: a matplotlib ``Figure`` on an
Agg canvas, no pyplot state; :func:`save_figure` writes it) are separate steps.

``<run>/curves.png`` is redrawn at each periodic checkpoint and at the stop by the learner's
MLflow child (:meth:`surreal_redis.tracking.Tracker.draw_curves`) from the store it writes, so
the history survives a learner restart and the redraw never holds the learner's GIL, and once
more after the final eval by a tracking child of ``launch`` (:mod:`surreal_redis.launcher.final_curve`).
matplotlib is imported inside the drawing functions only.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from surreal_redis.run_folder import RunFolder

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

TRAIN_CURVE = "curve/train_return"
"""The train curve: the mean return of the last ``tracking.curve_window`` training episodes, MLflow
step = env steps (:mod:`surreal_redis.learner.curve` logs the ``curve/`` metrics)."""
TRAIN_CURVE_S = "curve/train_elapsed_s"
EVAL_CURVE = "curve/eval_return"
"""One point per complete eval, the final eval last; step = env steps."""
EVAL_CURVE_S = "curve/eval_elapsed_s"
FINAL_EVAL = "curve/final_eval_return"
"""The launcher's final eval of the final checkpoint (also the last point of :data:`EVAL_CURVE`)."""
TRAIN_RETURN = "charts/episode_return_mean"
"""Runs without ``curve/`` metrics (older ones, a bench's peers) are drawn from these, one point
per learner report, paired with ``charts/env_steps`` and ``system/elapsed_s`` of the same report."""
EVAL_RETURN = "charts/eval_return"
ENV_STEPS = "charts/env_steps"
ELAPSED_S = "system/elapsed_s"
TARGET_PARAM = "stop.target_return"
WINDOW_PARAM = "tracking.curve_window"
AXES = {"steps": ("env_steps", "env steps"), "time": ("wall_s", "wall seconds (learner)")}
"""x axis name -> (Series field, axis label)."""
DPI = 100


class PlotError(ValueError):
    """A run folder or store without what a figure needs (the message names it)."""


class Series(NamedTuple):
    """One return curve: points in logging order, each with both x coordinates."""

    name: str
    """The run (a folder name, or 'SB3 zoo' in a bench)."""
    kind: str
    """'train' or 'eval'."""
    env_steps: tuple[float, ...]
    wall_s: tuple[float, ...]
    returns: tuple[float, ...]


class RunCurves(NamedTuple):
    """What :func:`read_curves` found for one run."""

    name: str
    series: tuple[Series, ...]
    """Train first, then eval, then 'final' (the final eval's one point, also eval's last); only
    those with points."""
    target: float | None
    """``stop.target_return`` of the run's config, if it had one."""
    window: int | None = None
    """The episodes the train curve averages (``tracking.curve_window``); None: not known."""


class Bars(NamedTuple):
    """One bar panel of a bench figure: a value (None: not measured) per label."""

    title: str
    labels: tuple[str, ...]
    values: tuple[float | None, ...]


# ---------------------------------------------------------------- reading
def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def series_from_history(name: str, kind: str, history: Iterable[Any], env_steps: Iterable[Any],
                        elapsed: Iterable[Any]) -> Series:
    """Pair each metric record of ``history`` (objects with ``value``, ``step``, ``timestamp``:
    MLflow's ``Metric``) with the env-steps and elapsed records of the same flush, which the
    learner logs in the same batch (same step, same timestamp). Records without both partners
    are left out."""
    steps_at = {(m.step, m.timestamp): float(m.value) for m in env_steps}
    seconds_at = {(m.step, m.timestamp): float(m.value) for m in elapsed}
    points = sorted((m.timestamp, m.step, steps_at[key], seconds_at[key], float(m.value)) for m in history
                    if _finite(m.value) and (key := (m.step, m.timestamp)) in steps_at and key in seconds_at)
    return Series(name, kind, tuple(p[2] for p in points), tuple(p[3] for p in points), tuple(p[4] for p in points))


def series_by_step(name: str, kind: str, history: Iterable[Any], seconds: Iterable[Any]) -> Series:
    """A ``curve/`` series: each record of ``history`` at env steps = its MLflow step, paired with
    the seconds record of the same point (same step and timestamp); unpaired ones left out."""
    seconds_at = {(m.step, m.timestamp): float(m.value) for m in seconds}
    points = sorted((m.timestamp, m.step, seconds_at[key], float(m.value)) for m in history
                    if _finite(m.value) and (key := (m.step, m.timestamp)) in seconds_at)
    return Series(name, kind, tuple(float(p[1]) for p in points), tuple(p[2] for p in points),
                  tuple(p[3] for p in points))


def series_from_points(name: str, kind: str, points: Iterable[Sequence[float]]) -> Series:
    """A :class:`Series` from ``(env steps, seconds, return)`` triples (a bench's peer)."""
    rows = [(float(steps), float(seconds), float(value)) for steps, seconds, value in points]
    return Series(name, kind, tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows))


def shift_time(curves: RunCurves, seconds: float) -> RunCurves:
    """``curves`` with ``seconds`` added to every wall-time coordinate (another clock's zero)."""
    return curves._replace(series=tuple(s._replace(wall_s=tuple(t + seconds for t in s.wall_s)) for s in curves.series))


def read_curves(client: Any, run_id: str, name: str) -> RunCurves:
    """The train and eval return series of MLflow run ``run_id`` (``client``: an ``MlflowClient``):
    the ``curve/`` metrics, or a run's report metrics where it has none (:data:`TRAIN_RETURN`).
    PlotError when the run has no return points yet."""
    keys = (TRAIN_CURVE, TRAIN_CURVE_S, EVAL_CURVE, EVAL_CURVE_S, FINAL_EVAL, TRAIN_RETURN, EVAL_RETURN, ENV_STEPS,
            ELAPSED_S)
    history = {key: client.get_metric_history(run_id, key) for key in keys}
    found = []
    for kind, key, seconds, reported in (("train", TRAIN_CURVE, TRAIN_CURVE_S, TRAIN_RETURN),
                                         ("eval", EVAL_CURVE, EVAL_CURVE_S, EVAL_RETURN)):
        points = series_by_step(name, kind, history[key], history[seconds])
        if not points.returns:
            points = series_from_history(name, kind, history[reported], history[ENV_STEPS], history[ELAPSED_S])
        found.append(points)
    found.append(series_by_step(name, "final", history[FINAL_EVAL], history[EVAL_CURVE_S]))
    series = tuple(s for s in found if s.returns)
    if not series:
        raise PlotError(f"MLflow run {run_id} of {name} has no return metrics yet ({TRAIN_CURVE}, {EVAL_CURVE}, "
                        f"{TRAIN_RETURN}, {EVAL_RETURN})")
    params = client.get_run(run_id).data.params
    window = params.get(WINDOW_PARAM) if history[TRAIN_CURVE] else None
    return RunCurves(name, series, _number(params.get(TARGET_PARAM)),
                     int(window) if window is not None and window.isdigit() else None)


def _number(text: str | None) -> float | None:
    """A param's number; None for none or text that is not one (a config without a numeric target)."""
    if text is None or text == "None":
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_run(run_dir: Path, name: str | None = None) -> RunCurves:
    """:func:`read_curves` of the run a launch left in ``run_dir``: its ``mlflow.db`` store and
    the run id in ``mlflow_run_id`` (as :class:`surreal_redis.tracking.Tracker` keeps them)."""
    run_dir = Path(run_dir)
    store, id_file = RunFolder(run_dir).mlflow_store, RunFolder(run_dir).mlflow_run_id_file
    if not store.is_file():
        raise PlotError(f"{run_dir}: no mlflow.db (not a run folder, or its run had tracking off)")
    if not id_file.is_file():
        raise PlotError(f"{run_dir}: no mlflow_run_id beside its mlflow.db")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store.resolve()}")
    run_id = id_file.read_text().strip()
    try:
        return read_curves(client, run_id, name or run_dir.name)
    except MlflowException as exc:
        raise PlotError(f"{run_dir}: cannot read MLflow run {run_id!r} from mlflow.db: {exc.message}") from None


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Folder names, or the paths where two folders share a name (seeds under different roots)."""
    names = [Path(d).name for d in run_dirs]
    return [name if names.count(name) == 1 else str(d) for name, d in zip(names, run_dirs)]


# ---------------------------------------------------------------- drawing
def _figure(panels: int, width: float = 5.0, height: float = 3.6,
            layout: Literal["constrained"] | None = "constrained") -> Figure:
    """An Agg figure ``panels`` panels wide; ``layout`` None: margins set by the caller."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * panels, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(figure)  # Agg by construction: no display, no pyplot figure registry
    return figure


def draw_curves(runs: Sequence[RunCurves], axes: Sequence[str] = ("steps", "time"), title: str = "") -> Figure:
    """Return against each x axis of ``axes`` ('steps', 'time'), a panel each: train solid (its
    label names the episodes it averages, when known), eval dashed with a dot per eval, the final
    eval a star, each distinct target once, dotted gray. One run: a color per kind, legend labels
    the kinds; several: a color per run, labels 'run kind'."""
    return draw_curve_rows([("", runs)], axes, title)


def draw_curve_rows(rows: Sequence[tuple[str, Sequence[RunCurves]]], axes: Sequence[str] = ("steps", "time"),
                    title: str = "", xlabels: Mapping[str, str] | None = None) -> Figure:
    """:func:`draw_curves` of several groups of runs (a bench's cases), a row of panels each,
    titled with its name; ``xlabels`` replaces :data:`AXES`' axis labels."""
    unknown = [axis for axis in axes if axis not in AXES]
    if unknown or not axes:
        raise ValueError(f"x axis {unknown[0] if unknown else axes!r} is not one of {', '.join(AXES)}")
    if not rows:
        raise ValueError("draw_curve_rows needs at least one row")
    # One row (a run's curves.png, redrawn at every eval and at the stop) gets fixed margins: the
    # constrained layout's extra pass over every artist doubled the time a save took (0.25-0.57 s
    # against 0.14 s on 2 cores), and the launch's exit waits for the last one.
    fixed = len(rows) == 1
    figure = _figure(len(axes), height=3.6 * len(rows), layout=None if fixed else "constrained")
    if fixed:
        headings = bool(title) + bool(rows[0][0])  # the figure's title, the row's name above its panels
        figure.subplots_adjust(left=0.16 / len(axes), right=0.985, bottom=0.14, top=(0.95, 0.88, 0.82)[headings],
                               wspace=0.22)
    for row, (name, runs) in enumerate(rows):
        single = len(runs) == 1
        for index, axis in enumerate(axes):
            field, label = AXES[axis]
            ax = figure.add_subplot(len(rows), len(axes), row * len(axes) + index + 1)
            for number, run in enumerate(runs):
                for series in run.series:
                    _draw_series(ax, series, getattr(series, field), run.window, single, number)
            for target in sorted({run.target for run in runs if run.target is not None}):
                ax.axhline(target, color="gray", linestyle=":", linewidth=1, label=f"target {target:g}")
            ax.set_xlabel((xlabels or {}).get(axis, label))
            ax.set_ylabel("episode return")
            if name:
                ax.set_title(name, fontsize="medium")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    return figure


KIND_STYLE = {"train": ("C0", "-", ""), "eval": ("C1", "--", "o"), "final": ("C1", "", "*")}
"""kind -> (color of a lone run, line style, marker)."""


def _draw_series(ax: Any, series: Series, xs: tuple[float, ...], window: int | None, single: bool,
                 number: int) -> None:
    """One series of run number ``number`` into ``ax``, at x coordinates ``xs``."""
    color, linestyle, marker = KIND_STYLE[series.kind]
    label = {"train": "train" + (f" (mean of last {window} episodes)" if window else ""),
             "eval": "eval", "final": f"final eval {series.returns[-1]:.1f}"}[series.kind]
    ax.plot(xs, series.returns, linestyle=linestyle or "none", color=color if single else f"C{number % 10}",
            linewidth=1.5, marker=marker or ("o" if len(series.returns) == 1 else ""),  # a lone point shows too
            markersize=14 if series.kind == "final" else 4, label=label if single else f"{series.name} {label}")


def _bar_label(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def draw_bars(panels: Sequence[Bars], title: str = "", columns: int = 3) -> Figure:
    """A bar panel per :class:`Bars`, ``columns`` to a row; an unmeasured value is drawn as a
    zero-height bar marked 'n/a'."""
    if not panels:
        raise ValueError("draw_bars needs at least one panel")
    columns = min(columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = _figure(columns, width=4.0, height=3.2 * rows)
    for index, panel in enumerate(panels):
        ax = figure.add_subplot(rows, columns, index + 1)
        heights = [0.0 if v is None else float(v) for v in panel.values]
        bars = ax.bar(panel.labels, heights, color=[f"C{i % 10}" for i in range(len(heights))])
        ax.bar_label(bars, labels=[_bar_label(v) for v in panel.values], fontsize="small")
        ax.margins(y=0.12)  # room for the labels above the tallest bar
        ax.set_title(panel.title, fontsize="medium")
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(axis="y", alpha=0.3)
    if title:
        figure.suptitle(title)
    return figure


def save_figure(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG at ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    figure.savefig(partial, format="png", dpi=DPI)
    os.replace(partial, path)
    return path


def save_beside(figure: Figure, json_path: Path) -> Path:
    """A bench's figure as a PNG beside its JSON result file (same name, ``.png``)."""
    return save_figure(figure, Path(json_path).with_suffix(".png"))


def plot_runs(run_dirs: Sequence[Path], out: Path, axes: Sequence[str] = ("steps", "time")) -> Path:
    """``surreal-redis plot``: the runs' curves overlaid in one PNG at ``out``."""
    runs = [read_run(Path(d), label) for d, label in zip(run_dirs, run_labels(run_dirs))]
    return save_figure(draw_curves(runs, axes), out)


class CurvesFile:
    """Redraws one run's ``curves.png`` from its MLflow store. A failure is logged with a warning
    the first time, at debug level after, and never raised: a figure must not stop a run."""

    def __init__(self, client: Any, run_id: str, name: str) -> None:
        self.client, self.run_id, self.name = client, run_id, name
        self.failed = False

    def redraw(self, path: Path) -> bool:
        """True when ``path`` was written; False when there is nothing to draw yet or it failed."""
        try:
            save_figure(draw_curves([read_curves(self.client, self.run_id, self.name)], title=self.name), path)
        except PlotError as exc:
            log.debug("no curves yet: %s", exc)
            return False
        except Exception as exc:  # the store, matplotlib or the disk
            if not self.failed:
                log.warning("return curves not drawn into %s (%s: %s); training goes on, later failures are "
                            "logged at debug level", path, type(exc).__name__, exc)
            else:
                log.debug("return curves not drawn into %s: %r", path, exc)
            self.failed = True
            return False
        return True


def result_panels(cases: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, str]) -> list[Bars]:
    """One :class:`Bars` per metric key of ``metrics`` (key -> title), a bar per case."""
    labels = tuple(cases)
    return [Bars(title, labels, tuple(case.get(key) for case in cases.values())) for key, title in metrics.items()]


def warm_up() -> None:
    """Draw a throwaway figure into memory: matplotlib's imports, fonts and PNG writer are then
    loaded (~1 s of CPU on 2 cores), and a later :class:`CurvesFile` draw costs only its drawing."""
    import io

    figure = _figure(1)
    axes = figure.subplots()
    axes.plot([0, 1], [0, 1], label="warm-up")
    axes.set_title("warm-up")
    axes.legend()
    figure.savefig(io.BytesIO(), format="png", dpi=DPI)
