"""The data behind a run's curves: the train curve's points from the episode records (from the
first episode, a point per ``curve_every_env_steps``, the window's mean), where evals land, what
a resume continues from, the eval cadence by updates or seconds, and the MLflow records the
tracker writes (read back with MLflow's client from a store in tmp)."""

from __future__ import annotations

import time

import pytest

from surreal_redis import plots
from surreal_redis.config import load_config
from surreal_redis.evaluator import POLL_S, Cadence
from surreal_redis.hub.run.episodes import EpisodeRecord
from surreal_redis.learner.curve import EVAL_RETURN, TRAIN_ELAPSED_S, TRAIN_RETURN, CurveLog, TrainCurve


def train(episode_return: float, length: int, agent: str = "0", at: float | None = None) -> EpisodeRecord:
    return EpisodeRecord(agent, "train", episode_return, length, 1, time.time() if at is None else at)


class Points:
    """A tracker that keeps what it was given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, int, int]] = []

    def log_points(self, records) -> None:
        self.records += records


def test_the_train_curve_starts_at_the_first_episode_and_then_has_a_point_per_steps():
    curve = TrainCurve(window=3, every_env_steps=100)
    points = [curve.add(train(float(i), 30), elapsed_s=float(i)) for i in range(1, 11)]
    made = [p for p in points if p is not None]
    # steps 30 (the first episode), then past 100, 200, 300: 120, 210, 300
    assert [p.env_steps for p in made] == [30, 120, 210, 300]
    assert made[0].value == 1.0  # the first episode alone
    assert [p.value for p in made[1:]] == [3.0, 6.0, 9.0]  # the mean of the last 3 episodes
    assert [p.elapsed_s for p in made] == [1.0, 4.0, 7.0, 10.0]


def test_one_long_episode_makes_one_point_however_many_multiples_it_passes():
    curve = TrainCurve(window=1, every_env_steps=10)
    assert curve.add(train(1.0, 5), 0.0) is not None
    assert curve.add(train(2.0, 45), 0.0).env_steps == 50
    assert curve.add(train(3.0, 5), 0.0) is None  # 55: the next point is due at 60
    assert curve.add(train(4.0, 5), 0.0).env_steps == 60


def test_a_resume_continues_the_steps_of_the_records_or_the_checkpoint_whichever_is_more():
    kept = CurveLog(Points(), 2, 100, elapsed=lambda: 50.0, env_steps=lambda: 150)
    kept.count([train(5.0, 90), train(7.0, 90)])  # the earlier run's records, still in the stream: 180 steps
    kept.resumed()
    assert kept.pending == [] and kept.train.env_steps == 180
    kept.episodes([train(9.0, 30)])
    assert [(key, value, step) for key, value, step, _ in kept.pending if key == TRAIN_RETURN] == [(TRAIN_RETURN, 8.0, 210)]
    lost = CurveLog(Points(), 2, 100, elapsed=lambda: 50.0, env_steps=lambda: 5000)  # a Redis without them
    lost.resumed()
    lost.episodes([train(9.0, 30)])
    assert lost.pending == []  # 5030: the next point is at 5100
    lost.episodes([train(11.0, 70)])
    assert [(value, step) for key, value, step, _ in lost.pending if key == TRAIN_RETURN] == [(10.0, 5100)]


def test_curve_log_points_pair_value_and_seconds_and_evals_land_where_their_version_was_published():
    state = {"steps": 0, "elapsed": 0.0}
    points = Points()
    log = CurveLog(points, 20, 1000, elapsed=lambda: state["elapsed"], env_steps=lambda: state["steps"])
    log.publish(1)  # the untrained parameters, at 0 steps
    state.update(steps=512, elapsed=3.0)
    log.publish(2)
    log.episodes([train(20.0, 15, at=time.time() - 1.0)])  # ended a second before this read
    log.evaluated(1, 9.5)
    log.evaluated(2, 30.0)
    log.evaluated(7, 60.0)  # not published by this learner: drawn at its steps now
    log.flush()
    records = points.records
    assert log.pending == []
    by_key = {}
    for key, value, step, stamp in records:
        by_key.setdefault(key, []).append((value, step, stamp))
    (train_value, train_step, train_stamp), = by_key[TRAIN_RETURN]
    (seconds, seconds_step, seconds_stamp), = by_key[TRAIN_ELAPSED_S]
    assert (train_value, train_step) == (20.0, 15) and (seconds_step, seconds_stamp) == (train_step, train_stamp)
    assert 1.5 < seconds <= 2.0  # the learner's seconds when the episode ended: 3 s now, a second ago
    assert [(value, step) for value, step, _ in by_key[EVAL_RETURN]] == [(9.5, 0), (30.0, 512), (60.0, 512)]
    stamps = [stamp for _, _, stamp in by_key[EVAL_RETURN]]
    assert len(set(stamps)) == 3  # each point its own timestamp: the pairing cannot mix two
    log.flush()
    assert points.records == records  # nothing new, nothing sent


def test_curve_settings_are_checked():
    with pytest.raises(ValueError, match="curve_window must be an integer >= 1, got 0"):
        load_config("smoke", ["tracking.curve_window=0"])
    with pytest.raises(ValueError, match="every_updates must be an integer >= 1 or null, got 0"):
        load_config("smoke", ["eval.every_updates=0"])


def test_an_eval_is_due_by_updates_or_seconds_whichever_comes_first():
    published = {"iteration": 0}
    asked = []

    def iteration() -> int:
        asked.append(1)
        return published["iteration"]

    cadence = Cadence(every_s=30.0, every_updates=100)
    assert cadence.due(0.0, iteration) and not asked  # the first eval at once
    cadence.evaluated(0.0, 0)
    published["iteration"] = 99
    assert not cadence.due(1.0, iteration)
    assert cadence.wait_s(1.0) == POLL_S  # polls the update count meanwhile
    published["iteration"] = 100
    assert cadence.due(2.0, iteration)
    cadence.evaluated(2.0, 100)
    assert cadence.due(32.0, iteration) and len(asked) == 2  # seconds first: the count is not read
    by_seconds = Cadence(every_s=30.0, every_updates=None)
    by_seconds.evaluated(0.0, 0)
    assert not by_seconds.due(10.0, lambda: 10**9) and by_seconds.wait_s(10.0) == 20.0


def test_read_curves_prefers_the_curve_metrics_and_marks_the_final_eval(tmp_path):
    from surreal_redis.tracking import Tracker

    tracker = Tracker(tmp_path / "run", "exp", "run")
    tracker.log_params({"stop.target_return": 475.0, "tracking.curve_window": 20})
    tracker.log_metrics({"charts/env_steps": 1000, "system/elapsed_s": 5.0, "charts/episode_return_mean": 99.0}, 1)
    tracker.log_points([("curve/train_return", 12.0, 20, 1000), ("curve/train_elapsed_s", 0.5, 20, 1000),
                        ("curve/train_return", 30.0, 1010, 2000), ("curve/train_elapsed_s", 2.0, 1010, 2000),
                        ("curve/eval_return", 9.0, 0, 1500), ("curve/eval_elapsed_s", 0.1, 0, 1500),
                        ("curve/eval_return", 500.0, 1500, 3000), ("curve/eval_elapsed_s", 4.0, 1500, 3000),
                        ("curve/final_eval_return", 500.0, 1500, 3000)])
    tracker.finish()
    curves = plots.read_run(tmp_path / "run")
    assert curves.series == (
        plots.Series("run", "train", (20.0, 1010.0), (0.5, 2.0), (12.0, 30.0)),
        plots.Series("run", "eval", (0.0, 1500.0), (0.1, 4.0), (9.0, 500.0)),
        plots.Series("run", "final", (1500.0,), (4.0,), (500.0,)))
    assert (curves.target, curves.window) == (475.0, 20)
    (ax, _) = plots.draw_curves([curves]).axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["train (mean of last 20 episodes)", "eval", "final eval 500.0", "target 475"]
    assert ax.get_lines()[2].get_marker() == "*"


def test_the_final_eval_is_added_to_the_finished_run_and_drawn_as_its_last_eval_point(tmp_path):
    from mlflow.tracking import MlflowClient

    from surreal_redis.launcher.final_curve import FinalCurve
    from surreal_redis.run_folder import RunFolder
    from surreal_redis.tracking import Tracker

    config = load_config("smoke", [f"experiment.root={tmp_path}", "tracking.enabled=true"])
    folder = RunFolder(config.experiment_dir)
    assert FinalCurve.start(config, folder) is None  # no MLflow run in the folder: nothing to add to
    learner = Tracker(folder.path, config.run, config.run)  # the learner's run, finished before the final eval
    learner.log_points([("curve/eval_return", 9.0, 0, 1000), ("curve/eval_elapsed_s", 0.1, 0, 1000)])
    learner.finish("FINISHED")
    curve = FinalCurve.start(config, folder)
    curve.end(500.0, {"env_steps": 81920, "elapsed_s": 12.5, "iteration": 320})
    client = MlflowClient(tracking_uri=f"sqlite:///{folder.mlflow_store}")
    run = client.get_run(learner.run_id)
    assert run.info.status == "FINISHED"  # as the learner left it
    assert [(m.value, m.step) for m in client.get_metric_history(learner.run_id, "curve/final_eval_return")] == \
        [(500.0, 81920)]
    evaluated = plots.read_run(folder.path).series[0]
    assert (evaluated.kind, evaluated.env_steps, evaluated.wall_s, evaluated.returns) == \
        ("eval", (0.0, 81920.0), (0.1, 12.5), (9.0, 500.0))
    assert folder.curves.read_bytes()[:4] == b"\x89PNG"  # redrawn with it
    assert "Traceback" not in folder.log_file("final-eval").read_text()
    FinalCurve.start(config, folder).end(None, {})  # no score: nothing logged, the child ends
    assert len(client.get_metric_history(learner.run_id, "curve/eval_return")) == 2


def test_the_readme_picture_is_the_one_its_script_regenerates():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    picture = re.search(r"!\[PPO CartPole-v1[^\]]*\]\((docs/img/[^)]+\.png)\)", readme).group(1)
    script = (root / "scripts" / "readme-picture").read_text()
    assert "scripts/readme-picture" in readme and f"picture={picture}" in script
    assert "launch configs/ppo_cartpole.yaml" in script  # the quick start the README shows


def test_points_go_to_the_tracker_once_per_report_interval_and_all_at_the_stop():
    points = Points()
    log = CurveLog(points, 20, 10, elapsed=lambda: 1.0, env_steps=lambda: 0, every_s=60.0)
    log.episodes([train(1.0, 10), train(2.0, 10)])
    log.flush()  # within the interval: kept
    assert points.records == [] and len(log.pending) == 4
    log.flush(force=True)
    assert [(key, value, step) for key, value, step, _ in points.records if key == TRAIN_RETURN] == \
        [(TRAIN_RETURN, 1.0, 10), (TRAIN_RETURN, 1.5, 20)]
