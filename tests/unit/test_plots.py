"""Return curves: series read from a real MLflow SQLite store written by the project's Tracker
(paired by flush, gaps and NaN left out, the target from the params), the figure's Line2D data
on both x axes, the bench bars, `surreal-redis plot` and its one-line errors, a draw that fails
without stopping anything, and a learner's run that leaves curves.png read from its store."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from surreal_redis import plots
from surreal_redis.cli import main as cli
from surreal_redis.hub.run.episodes import EpisodeLog
from surreal_redis.learner.loop import Learner
from surreal_redis.learner.prefetch import PrefetchQueue
from surreal_redis.plots import Bars, PlotError, RunCurves, Series
from surreal_redis.run_folder import CURVES_FILE
from surreal_redis.runtime import StopFlag
from surreal_redis.tracking import Tracker

from .test_learner import episode, ppo_config, received, send_steps

# one learner flush each: (update, env steps, elapsed s, train return, eval return)
FLUSHES = [(1, 64, 2.0, None, None), (2, 128, 4.5, 20.0, None), (3, 192, 7.0, 35.5, 180.0),
           (4, 256, 9.0, 60.0, 180.0), (5, 320, 12.5, float("nan"), 500.0)]


def write_run(folder: Path, name: str, flushes=FLUSHES, target: float | None = 475.0) -> Path:
    """A run folder as the learner leaves it, written through Tracker (mlflow.db, mlflow_run_id)."""
    tracker = Tracker(folder, "exp", name)
    tracker.log_params({"stop.target_return": target, "env.env_id": "CartPole-v1"})
    for update, steps, elapsed, train, evaluated in flushes:
        tracker.log_metrics({"charts/env_steps": steps, "system/elapsed_s": elapsed, "charts/episode_return_mean": train,
                             "charts/eval_return": evaluated, "losses/value": 1.0}, update)
    tracker.finish()
    return folder


def test_series_come_from_the_store_paired_by_flush(tmp_path):
    curves = plots.read_run(write_run(tmp_path / "cartpole_a", "cartpole_a"))
    assert curves == RunCurves("cartpole_a", (
        Series("cartpole_a", "train", (128.0, 192.0, 256.0), (4.5, 7.0, 9.0), (20.0, 35.5, 60.0)),
        Series("cartpole_a", "eval", (192.0, 256.0, 320.0), (7.0, 9.0, 12.5), (180.0, 180.0, 500.0)),
    ), 475.0)
    assert plots.read_run(tmp_path / "cartpole_a", name="seed 1").name == "seed 1"


def test_a_value_without_both_partners_of_its_flush_is_left_out():
    def metric(value, step, timestamp):
        return SimpleNamespace(value=value, step=step, timestamp=timestamp)

    history = [metric(3.0, 2, 200), metric(1.0, 1, 100), metric(2.0, 1, 150)]  # 150: a batch of its own
    series = plots.series_from_history("r", "train", history, [metric(10, 1, 100), metric(20, 2, 200)],
                                       [metric(1.5, 1, 100), metric(2.5, 2, 200), metric(9.0, 1, 150)])
    assert series == Series("r", "train", (10.0, 20.0), (1.5, 2.5), (1.0, 3.0))


def test_a_store_without_returns_or_a_folder_without_a_store_is_refused(tmp_path):
    write_run(tmp_path / "early", "early", [(1, 64, 2.0, None, None)])
    with pytest.raises(PlotError, match=r"of early has no return metrics yet \(curve/train_return, curve/eval_return, charts/episode_return_mean"):
        plots.read_run(tmp_path / "early")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlotError, match=r"empty: no mlflow.db \(not a run folder"):
        plots.read_run(tmp_path / "empty")


def test_a_run_without_a_numeric_target_draws_no_target(tmp_path):
    assert plots.read_run(write_run(tmp_path / "free", "free", target=None)).target is None


def two_runs() -> list[RunCurves]:
    a = RunCurves("a", (Series("a", "train", (1.0, 2.0), (0.5, 1.0), (10.0, 20.0)),
                        Series("a", "eval", (2.0,), (1.0,), (30.0,))), 475.0)
    b = RunCurves("b", (Series("b", "train", (1.0, 3.0), (0.7, 2.0), (5.0, 50.0)),), None)
    return [a, b]


def test_the_figure_draws_each_series_against_env_steps_and_wall_seconds():
    figure = plots.draw_curves(two_runs(), title="t")
    steps_ax, time_ax = figure.axes
    assert (steps_ax.get_xlabel(), time_ax.get_xlabel()) == ("env steps", "wall seconds (learner)")
    for ax, field in ((steps_ax, "env_steps"), (time_ax, "wall_s")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"a train", "a eval", "target 475", "b train"}
        for run in two_runs():
            for series in run.series:
                line = lines[f"{series.name} {series.kind}"]
                assert tuple(line.get_xdata()) == getattr(series, field)
                assert tuple(line.get_ydata()) == series.returns
        assert tuple(lines["target 475"].get_ydata()) == (475.0, 475.0)
        assert lines["a eval"].get_linestyle() == "--" and lines["a eval"].get_marker() == "o"  # a dot per eval
        assert lines["a train"].get_linestyle() == "-"
        assert lines["a train"].get_color() == lines["a eval"].get_color() != lines["b train"].get_color()


def test_one_run_is_labelled_by_kind_and_one_axis_can_be_chosen():
    figure = plots.draw_curves(two_runs()[:1], axes=("time",))
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.get_lines()] == ["train", "eval", "target 475"]
    assert len({line.get_color() for line in ax.get_lines()}) == 3
    assert tuple(ax.get_lines()[0].get_xdata()) == (0.5, 1.0)
    with pytest.raises(ValueError, match="x axis 'steps_per_s' is not one of steps, time"):
        plots.draw_curves(two_runs(), axes=("steps_per_s",))


def test_bars_have_one_rectangle_per_label_with_its_value():
    figure = plots.draw_bars([Bars("env steps", ("lockstep", "free"), (100.0, 6400.0)),
                              Bars("solve s", ("lockstep", "free"), (30.0, None))], columns=2)
    first, second = figure.axes
    assert [p.get_height() for p in first.patches] == [100.0, 6400.0]
    assert [t.get_text() for t in first.texts] == ["100", "6,400"]
    assert [t.get_text() for t in first.get_xticklabels()] == ["lockstep", "free"]
    assert [p.get_height() for p in second.patches] == [30.0, 0.0]
    assert "n/a" in [t.get_text() for t in second.texts]
    assert second.get_title() == "solve s"


def test_result_panels_take_one_value_per_case():
    cases = {"lockstep": {"updates": 10, "env_steps": 640}, "free": {"updates": 12}}
    assert plots.result_panels(cases, {"updates": "updates", "env_steps": "env steps"}) == [
        Bars("updates", ("lockstep", "free"), (10, 12)), Bars("env steps", ("lockstep", "free"), (640, None))]


def test_save_writes_a_png(tmp_path):
    path = plots.save_figure(plots.draw_curves(two_runs()), tmp_path / "sub" / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["c.png"]  # no partial file left


def test_plot_command_overlays_runs_and_names_what_it_refuses(tmp_path):
    write_run(tmp_path / "seed1", "seed1")
    write_run(tmp_path / "seed2", "seed2")
    out = tmp_path / "overlay.png"
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "seed1"), str(tmp_path / "seed2"), "--out", str(out),
                                      "--x", "time"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out) and out.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bare").mkdir()
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "seed1"), str(tmp_path / "bare"), "--out", str(out)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {tmp_path / 'bare'}: no mlflow.db (not a run folder, "
                                                  "or its run had tracking off)"]
    write_run(tmp_path / "early", "early", [(1, 64, 2.0, None, None)])
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "early"), "--out", str(out)])
    assert result.exit_code == 1 and "has no return metrics yet" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_same_named_folders_are_labelled_by_path():
    assert plots.run_labels([Path("a/run"), Path("b/run"), Path("c")]) == ["a/run", "b/run", "c"]


def test_a_failed_draw_warns_once_and_raises_nothing(tmp_path, caplog):
    folder = write_run(tmp_path / "run", "run")
    tracker = Tracker(folder, "exp", "run")  # continues the folder's run
    tracker.draw_curves(folder / "curves.png")
    assert plots.read_run(folder).series[0].returns == (20.0, 35.5, 60.0)
    assert (folder / "curves.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "a-file").write_text("")
    with caplog.at_level(logging.DEBUG, logger="surreal_redis.plots"):
        for _ in range(3):
            tracker.draw_curves(tmp_path / "a-file" / "curves.png")  # no folder can be made below a file
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "return curves not drawn into" in warnings[0].getMessage()
    assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) == 2


def test_a_learner_run_leaves_curves_read_from_its_store(fake_redis, tmp_path):
    """Tracking through the child process, as launched: the train curve a point per episode record
    (every 10 env steps, each episode 10 long) from the first one, averaged over the last 2, and
    each eval where its version was published reach the store as ``curve/`` metrics (step = env
    steps), and curves.png is drawn from it at the checkpoints and the stop."""
    config = ppo_config(tmp_path, "tracking.enabled=true", "checkpoint.min_interval_s=0", "learner.metrics_every_s=0",
                        "eval.episodes=2", "tracking.curve_window=2", "tracking.curve_every_env_steps=10")
    learner = Learner.from_config(config, fake_redis, StopFlag(install_handlers=False))
    learner.start()
    episodes = EpisodeLog(fake_redis, config.run)
    for round_index, train_return in enumerate((10.0, 30.0, 50.0)):
        episodes.record([episode("train", train_return, learner.param_version)])
        if round_index == 1:
            episodes.record([episode("eval", 100.0, learner.param_version)] * 2)
            evaluated_at = learner.env_steps  # the version was published at these steps (lockstep: none since)
        send_steps(fake_redis, config, learner, 32)
        learner._next_housekeeping = 0.0  # housekeeping (episodes, the metrics flush) every round
        learner.iterate(received(learner))
    learner.iterate(PrefetchQueue(1))
    learner._finish("FINISHED")
    assert (config.experiment_dir / CURVES_FILE).read_bytes()[:4] == b"\x89PNG"
    curves = plots.read_run(config.experiment_dir)
    train, evaluated = curves.series
    assert (train.env_steps, train.returns) == ((10.0, 20.0, 30.0), (10.0, 20.0, 40.0))
    assert train.wall_s == tuple(sorted(train.wall_s)) and 0 <= train.wall_s[0] <= train.wall_s[-1] <= learner.elapsed()
    assert (evaluated.env_steps, evaluated.returns) == ((float(evaluated_at),), (100.0,))
    assert curves.window == 2


def test_the_launch_summary_names_the_curves_or_says_none_were_drawn(tmp_path, fake_redis):
    from surreal_redis.config import load_config
    from surreal_redis.launcher import Launcher

    config = load_config("smoke", [f"experiment.root={tmp_path}", "experiment.name=summary", "tracking.enabled=true"])
    lines: list[str] = []
    launcher = Launcher(config, StopFlag(install_handlers=False), progress=lines.append)
    launcher._summary(fake_redis, 0)
    assert "  curves: none drawn (no return logged)" in lines[-1].splitlines()
    plots.save_figure(plots.draw_curves(two_runs()[:1]), config.experiment_dir / CURVES_FILE)
    launcher._summary(fake_redis, 0)
    assert f"  curves: {config.experiment_dir / CURVES_FILE}" in lines[-1].splitlines()


def test_a_launched_learner_leaves_its_final_curves_to_the_launch(fake_redis, tmp_path):
    """``learner --final-curves-by-launch`` (launch's learner, when a final eval is due): its stop
    logs and closes the MLflow run but does not redraw curves.png, which the final eval redraws
    with its point; a learner on its own redraws it."""
    from surreal_redis.learner.parts import LearnerParts

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def __getattr__(self, name: str):
            return lambda *args, **kwargs: self.calls.append(name)

    config = ppo_config(tmp_path)
    calls = {}
    for final_draw in (True, False):
        tracker = Recorder()
        learner = Learner(config, fake_redis, StopFlag(install_handlers=False), LearnerParts.of(config),
                          tracker=tracker, final_draw=final_draw)  # type: ignore[arg-type]
        learner._finish("FINISHED")
        calls[final_draw] = tracker.calls
    assert calls[True].count("draw_curves") == 1 and calls[True][-1] == "finish"
    assert "draw_curves" not in calls[False] and calls[False][-1] == "finish"
