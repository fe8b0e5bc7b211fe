"""The eval process: plays episodes with the latest parameters in an eval mode, sends no
experience, and reports every episode (mode ``eval``) to the episodes stream, where the learner
turns complete evals into ``charts/eval_return`` and best-k checkpoints. :func:`score_checkpoint`
is the final eval ``launch`` ends a run with (``eval --checkpoint``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import redis

from surreal_redis.algos.base import ActMode
from surreal_redis.algos.learning import make_trainer
from surreal_redis.algos.policies import AgentPolicy, make_policy
from surreal_redis.checkpoint import CheckpointError, CheckpointManager
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import RedisClient
from surreal_redis.envs import make_env
from surreal_redis.hub.params import ParameterClient, ParamFetchError, connect_replicas
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeRecord
from surreal_redis.outage import OUTAGE_ERRORS, OutageGuard
from surreal_redis.runtime import StopFlag
from surreal_redis.seeds import eval_episode_seed, evaluator_seeds, final_episode_seed, final_eval_seeds
from surreal_redis.trees import tree_map

log = logging.getLogger(__name__)

EVAL_MODES = {"deterministic": ActMode.EVAL_DETERMINISTIC, "stochastic": ActMode.EVAL_STOCHASTIC}


def play_episode(env, policy, mode: ActMode, seed: int | None, stop: StopFlag | Deadline | None = None,
                 on_frame=None) -> tuple[float, int]:
    """One episode with a single (non-vector) env; returns (return, length). ``on_frame`` is
    called after every step (e.g. to record video frames)."""
    obs, _ = env.reset(seed=seed)
    policy.on_episode_start(0)
    total, length = 0.0, 0
    while stop is None or not stop:
        batched = tree_map(lambda leaf: np.asarray(leaf)[None], obs)
        action = policy.act(batched, mode).actions[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        length += 1
        if on_frame is not None:
            on_frame()
        if terminated or truncated:
            break
    policy.on_episode_end(0, total, length)
    return total, length


def checkpoint_policy(config: ExperimentConfig, path: Path, env) -> tuple[AgentPolicy, int, dict]:
    """The policy (acting as agents do) with the actor parameters of checkpoint ``path``, the
    checkpoint's learner update count and its state dict; CheckpointError for another algo's file."""
    state = CheckpointManager.load(path)
    if state.get("algo") != config.algo:
        raise CheckpointError(f"checkpoint {path} is for algo {state.get('algo')!r}, the config says {config.algo!r}")
    on_cpu = [f"{config.algo}.device=cpu"] if hasattr(config.algo_config, "device") else []
    algo = make_trainer(config.with_overrides(on_cpu).algo_config, env.observation_space, env.action_space)
    algo.load_state_dict(state["algorithm"])
    policy = make_policy(config.algo_config, env.observation_space, env.action_space, 1, agent_id=0,
                         num_agents=config.agent.num_agents, seed=final_eval_seeds(config.experiment.seed).policy,
                         inference=config.agent.inference)
    policy.load_params(algo.actor_params(), int(state.get("param_version", 0)))
    return policy, int(algo.iteration), state


class Deadline:
    """Truthy once ``stop`` is set or ``seconds`` have passed. ``play_episode`` tests it before each
    step only, so ``cut`` (it was found truthy) tells an episode it ended from one that finished."""

    def __init__(self, stop: StopFlag, seconds: float) -> None:
        self.stop, self.at = stop, time.monotonic() + seconds
        self.cut = False

    def __bool__(self) -> bool:
        self.cut |= bool(self.stop) or time.monotonic() >= self.at
        return self.cut


class CheckpointScore(NamedTuple):
    """A final eval: the checkpoint file and its update count, the returns of the episodes that
    finished (of ``episodes`` asked) in ``seconds``, and whether it entered the best-k. ``interrupted``:
    a signal ended it, and nothing was recorded."""

    checkpoint: str
    iteration: int
    returns: list[float]
    episodes: int
    seconds: float
    interrupted: bool
    kept: bool

    @property
    def score(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns and not self.interrupted else None


def score_checkpoint(config: ExperimentConfig, path: Path, stop: StopFlag, mode: str | None = None) -> CheckpointScore:
    """Play checkpoint ``path`` (in ``<experiment>/checkpoints``) for ``eval.final_episodes``
    episodes, stopping at ``eval.final_max_s`` seconds of play (an episode cut there does not
    count), and enter the mean of those finished into the folder's best-k under the checkpoint's
    update count. A stop signal ends it with nothing recorded."""
    act_mode = _act_mode(config, mode)
    path = Path(path).resolve()
    manager = CheckpointManager(path.parent, config.checkpoint)
    env = make_env(config.env, seed=final_eval_seeds(config.experiment.seed).envs, mode="eval")
    policy, iteration, _ = checkpoint_policy(config, path, env)
    if manager.path_for(iteration) != path:
        raise CheckpointError(f"checkpoint {path} holds update {iteration}: its best-k entry would name "
                              f"{manager.path_for(iteration).name}")
    started = time.monotonic()
    until = Deadline(stop, config.eval.final_max_s)
    returns: list[float] = []
    for episode in range(config.eval.final_episodes):
        total, _ = play_episode(env, policy, act_mode, final_episode_seed(config.experiment.seed, episode), until)
        if until.cut:
            break
        returns.append(total)
    env.close()
    seconds = time.monotonic() - started
    interrupted = bool(stop)
    kept = bool(returns) and not interrupted and manager.record_score(iteration, float(np.mean(returns)))
    result = CheckpointScore(str(path), iteration, returns, config.eval.final_episodes, seconds, interrupted, kept)
    score = "no score" if result.score is None else f"mean return {result.score:.2f}"
    log.info("final eval of update %d: %s over %d of %d episodes in %.1fs%s", iteration,
             "interrupted" if interrupted else score, len(returns), result.episodes, seconds,
             ", kept among the best" if kept else "")
    return result


def _act_mode(config: ExperimentConfig, mode: str | None) -> ActMode:
    """``mode`` (None: ``eval.mode``) as an ActMode; ValueError when it is not one."""
    mode = mode or config.eval.mode
    if mode not in EVAL_MODES:
        raise ValueError(f"eval mode {mode!r} is not one of {sorted(EVAL_MODES)}")
    return EVAL_MODES[mode]


POLL_S = 0.5
"""With ``eval.every_updates``, how often the eval reads the published update count (one HGETALL
of the parameters' meta)."""


class Cadence:
    """When the next eval is due: ``eval.every_s`` seconds after the last one began, or, with
    ``eval.every_updates``, once the published update count is that many past the last eval's,
    whichever comes first. The first eval is due at once."""

    def __init__(self, every_s: float, every_updates: int | None) -> None:
        self.every_s, self.every_updates = every_s, every_updates
        self.last: tuple[float, int] | None = None  # (time.monotonic(), update count) of the last eval

    def evaluated(self, now: float, iteration: int) -> None:
        self.last = (now, iteration)

    def wait_s(self, now: float) -> float:
        """Seconds until the time cadence makes an eval due (0: due), at most :data:`POLL_S` when
        the update cadence may make it due before."""
        if self.last is None:
            return 0.0
        left = max(0.0, self.last[0] + self.every_s - now)
        return min(left, POLL_S) if self.every_updates is not None else left

    def due(self, now: float, published_iteration: Callable[[], int]) -> bool:
        """Whether an eval is due; ``published_iteration()`` is asked only when time alone says no."""
        if self.last is None or now >= self.last[0] + self.every_s:
            return True
        return self.every_updates is not None and published_iteration() >= self.last[1] + self.every_updates


class Evaluator:
    """``surreal-redis eval``: after each new parameter version, once the :class:`Cadence` of
    ``eval.every_s`` and ``eval.every_updates`` says an eval is due, plays ``eval.episodes``
    episodes and reports them. Records a full Redis refuses (OOM) are sent again with capped
    backoff until stored or stopped, as agents do, never played again; ``records_refused`` counts
    the refusals."""

    def __init__(self, config: ExperimentConfig, client: RedisClient, stop: StopFlag,
                 mode: str | None = None, eval_id: int = 0) -> None:
        self.config, self.client, self.stop, self.mode = config, client, stop, _act_mode(config, mode)
        self.name = f"eval-{eval_id}"
        seeds = evaluator_seeds(config.experiment.seed, eval_id)  # apart from the agents' and each other's
        self.env = make_env(config.env, seed=seeds.envs, mode="eval")
        self.policy = make_policy(config.algo_config, self.env.observation_space, self.env.action_space, 1,
                                  agent_id=0, num_agents=config.agent.num_agents,
                                  seed=seeds.policy, inference=config.agent.inference)
        self.params = ParameterClient(client, config.run, config.hub.params_client,
                                      connect_replicas(config.redis.param_read_urls, config.redis.settings()))
        self.episodes = EpisodeLog(client, config.run, config.hub.episodes_maxlen)
        self.control = RunControl(client, config.run)
        self.eval_id = eval_id
        self.episodes_played = 0  # numbers the episodes' reset seeds (eval_episode_seed)
        self.records_refused = 0
        self.cadence = Cadence(config.eval.every_s, config.eval.every_updates)

    def run(self) -> int:
        """Evaluate until stopped (signal or the run's stop request); returns the exit code."""
        guard = OutageGuard(self.name, self.stop)
        while not self.stop:
            try:
                stopping, _ = self.control.stopping()
                if stopping:
                    break
                if not self.cadence.due(time.monotonic(), self._published_iteration):
                    guard.succeeded()
                    self.stop.wait(self.cadence.wait_s(time.monotonic()))
                    continue
                params, info = self.params.fetch()
                if params is None:  # nothing new yet
                    guard.succeeded()
                    self.stop.wait(min(self.config.eval.every_s, POLL_S) if self.policy.version >= 0 else 0.2)
                    continue
                self.policy.load_params(params, info.version)
                self.cadence.evaluated(time.monotonic(), info.iteration)
                self._evaluate(info.version)
                guard.succeeded()
            except OUTAGE_ERRORS as exc:
                guard.failed(exc)
                continue
        self.env.close()
        return 0

    def _published_iteration(self) -> int:
        """The learner's update count in the published parameters' meta (-1 when malformed: the
        parameter fetch reports that); Redis errors propagate."""
        try:
            return self.params.fetch_info().iteration
        except ParamFetchError as exc:
            log.debug("%s: published meta unreadable (%s)", self.name, exc)
            return -1

    def _evaluate(self, version: int) -> None:
        records = []
        for _ in range(self.config.eval.episodes):
            if self.stop:
                return  # an incomplete eval is not reported: the learner scores complete ones only
            seed = eval_episode_seed(self.config.experiment.seed, self.eval_id, self.episodes_played)
            self.episodes_played += 1
            total, length = play_episode(self.env, self.policy, self.mode, seed, self.stop)
            records.append(EpisodeRecord(self.name, "eval", total, length, version, time.time()))
        if self.stop or not self._report(records):
            return
        log.info("%s: v%d scored %.2f over %d episodes", self.name, version,
                 float(np.mean([r.episode_return for r in records])), len(records))

    def _report(self, records: list[EpisodeRecord]) -> bool:
        """Store ``records``, sending those a full Redis refused again after a capped backoff (the
        learner's janitor frees memory meanwhile); False when stopped first. Connection errors
        propagate to :meth:`run`'s outage handling."""
        backoff = OutageGuard(f"{self.name} (eval records)", self.stop, errors=(redis.exceptions.OutOfMemoryError,))
        while records:
            if self.stop:
                log.warning("%s: stopped with %d eval records of v%d refused for lack of memory", self.name,
                            len(records), records[0].version)
                return False
            refused = self.episodes.record_some(records)
            if refused:
                self.records_refused += len(refused)
                backoff.failed(redis.exceptions.OutOfMemoryError(
                    f"{len(refused)} of {len(records)} eval records refused: Redis is out of memory"))
            records = refused
        backoff.succeeded()
        return True
