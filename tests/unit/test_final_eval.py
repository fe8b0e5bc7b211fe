"""The final eval of a run (evaluator.score_checkpoint; ``eval --checkpoint``): exactly one
checkpoint's parameters, a bounded number of episodes and seconds, the score into best-k."""

from pathlib import Path

import pytest

from surreal_redis.algos.learning import make_trainer
from surreal_redis.checkpoint import CheckpointError, CheckpointManager
from surreal_redis.config import load_config
from surreal_redis.envs import make_env
from surreal_redis.evaluator import Deadline, checkpoint_policy, score_checkpoint
from surreal_redis.runtime import StopFlag
from surreal_redis.seeds import final_episode_seed, final_eval_seeds


def smoke_config(tmp_path: Path, *overrides: str):
    return load_config("smoke", [f"experiment.root={tmp_path}", "checkpoint.keep_best=1", *overrides])


def write_checkpoint(config, iteration: int, seed: int = 0) -> Path:
    """A learner-like checkpoint of an untrained PPO CartPole policy at update ``iteration``."""
    env = make_env(config.env, seed=0, mode="eval")
    algo = make_trainer(config.algo_config, env.observation_space, env.action_space, seed)
    env.close()
    algo.iteration = iteration
    manager = CheckpointManager(config.experiment_dir / "checkpoints", config.checkpoint)
    return manager.save({"algorithm": algo.state_dict(), "algo": config.algo, "param_version": iteration + 1,
                         "env_steps": 256 * iteration}, iteration)


def test_the_final_checkpoint_is_scored_and_enters_best_k(tmp_path):
    config = smoke_config(tmp_path, "eval.final_episodes=3")
    early = write_checkpoint(config, 5, seed=1)
    manager = CheckpointManager(early.parent, config.checkpoint)
    assert manager.record_score(5, -1.0)  # an early eval; CartPole returns are >= 1
    final = write_checkpoint(config, 10, seed=2)
    result = score_checkpoint(config, final, StopFlag(install_handlers=False))
    assert (result.iteration, result.episodes, len(result.returns), result.interrupted) == (10, 3, 3, False)
    assert result.kept and result.score == pytest.approx(sum(result.returns) / 3) and result.score >= 1
    assert manager.best() == [(result.score, 10)] and manager.resolve("best") == final
    # exactly that file's parameters: the same episodes played by hand score the same
    env = make_env(config.env, seed=final_eval_seeds(config.experiment.seed).envs, mode="eval")
    policy, iteration, _ = checkpoint_policy(config, final, env)
    from surreal_redis.evaluator import EVAL_MODES, play_episode

    again = [play_episode(env, policy, EVAL_MODES["deterministic"], final_episode_seed(config.experiment.seed, k))[0]
             for k in range(3)]
    assert iteration == 10 and again == result.returns


def test_the_time_cap_counts_finished_episodes_only(tmp_path):
    config = smoke_config(tmp_path, "eval.final_episodes=3", "eval.final_max_s=1e-9")
    path = write_checkpoint(config, 4)
    result = score_checkpoint(config, path, StopFlag(install_handlers=False))
    assert result.returns == [] and result.score is None and not result.kept and not result.interrupted
    assert CheckpointManager(path.parent, config.checkpoint).best() == []


def test_a_stop_signal_ends_it_with_nothing_recorded(tmp_path):
    config = smoke_config(tmp_path)
    path = write_checkpoint(config, 4)
    stop = StopFlag(install_handlers=False)
    stop.set("signal SIGINT")
    result = score_checkpoint(config, path, stop)
    assert result.interrupted and result.score is None and not result.kept
    assert CheckpointManager(path.parent, config.checkpoint).best() == []


def test_a_deadline_tells_a_cut_episode_from_a_finished_one():
    stop = StopFlag(install_handlers=False)
    long = Deadline(stop, 3600)
    assert not long and not long.cut
    stop.set("signal SIGTERM")
    assert long and long.cut
    assert Deadline(StopFlag(install_handlers=False), -1)


def test_a_checkpoint_of_another_name_or_algo_is_refused(tmp_path):
    config = smoke_config(tmp_path)
    path = write_checkpoint(config, 4)
    renamed = path.with_name("ckpt-0000000009.pt")
    path.rename(renamed)
    with pytest.raises(CheckpointError, match="holds update 4"):
        score_checkpoint(config, renamed, StopFlag(install_handlers=False))
    with pytest.raises(CheckpointError, match="is for algo 'ppo', the config says 'ddpg'"):
        score_checkpoint(load_config(None, ["algo=ddpg", "env.env_id=Pendulum-v1", f"experiment.root={tmp_path}",
                                            "experiment.name=smoke"]), renamed, StopFlag(install_handlers=False))
