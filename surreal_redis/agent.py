"""The agent process: a stateless env loop that acts with the latest parameters and sends its
experience to the hub.

Per vector step: act -> step -> ``sender.add`` (which flushes a chunk every ``flush_steps``);
every ``agent.fetch_every_steps`` steps one tiny version poll (parameters are downloaded only
when the version changed); a heartbeat and a look at the run's control state every
``agent.heartbeat_every_s``. Finished episodes go to the episodes stream. A Redis outage is
ridden out with capped backoff (experience of the outage is dropped and counted, never
duplicated); the first SIGTERM/SIGINT or a ``stop`` flushes and exits 0, the second exits at once.
A stop is noticed within a second even while the sender waits on backpressure (``max_lag``).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import redis

from surreal_redis.algos.base import ActMode, AgentPolicy
from surreal_redis.algos.registry import make_policy
from surreal_redis.codec import Tree
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import OUTAGE_ERRORS as REDIS_OUTAGE_ERRORS
from surreal_redis.connection import Backoff, OutageGuard
from surreal_redis.envs import make_vector_env, step_vector_env
from surreal_redis.hub.experience.sender import ExperienceSender, HubUnavailableError
from surreal_redis.hub.params import ParameterClient
from surreal_redis.hub.run.control import RunControl, StopWatch
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeRecord
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.runtime import StopFlag
from surreal_redis.trees import tree_map

log = logging.getLogger(__name__)

OUTAGE_ERRORS = (*REDIS_OUTAGE_ERRORS, HubUnavailableError)


def agent_seed(base_seed: int, agent_id: int) -> int:
    """Distinct, reproducible env/noise seeds per agent."""
    return base_seed * 100_003 + 1_000 * agent_id + 1


def with_final_rows(obs: Tree, final_obs: dict[int, Tree]) -> Tree | None:
    """A copy of ``obs`` (leaves ``[N, ...]``) whose rows ``i`` are replaced by ``final_obs[i]``:
    the form :meth:`ExperienceSender.add` takes. None when no episode ended."""
    if not final_obs:
        return None
    envs = list(final_obs)

    def replace(leaf: np.ndarray, *finals: np.ndarray) -> np.ndarray:
        out = np.array(leaf, copy=True)
        for env, value in zip(envs, finals):
            out[env] = value
        return out

    return tree_map(replace, obs, *(final_obs[env] for env in envs))


class Agent:
    """One agent process (``surreal-redis agent --id K``); :meth:`run` blocks until stopped."""

    def __init__(self, config: ExperimentConfig, client: redis.Redis, agent_id: int, stop: StopFlag) -> None:
        if agent_id < 0:
            raise ValueError(f"agent id must be >= 0, got {agent_id}")
        self.config, self.client, self.agent_id, self.stop = config, client, agent_id, stop
        seed = agent_seed(config.experiment.seed, agent_id)
        self.envs = make_vector_env(config.env, num_envs=config.env.num_envs, seed=seed, mode="train")
        self.num_envs = self.envs.num_envs
        self.policy: AgentPolicy = make_policy(config.algo_config, self.envs.single_observation_space,
                                               self.envs.single_action_space, self.num_envs, agent_id,
                                               config.agent.num_agents, seed)
        self.control = RunControl(client, config.run)
        self.sender = ExperienceSender(client, config.hub.sender, config.run, agent_id, config.redis.num_shards,
                                       stop=StopWatch(stop, self.control))
        self.params = ParameterClient(client, config.run, config.hub.params_client)
        self.heartbeat = Heartbeat(client, config.run, agent_id, config.agent.heartbeat_ttl_s)
        self.episodes = EpisodeLog(client, config.run, config.hub.episodes_maxlen)
        self.seed = seed
        self.steps = 0
        self.num_episodes = 0
        self._last_obs: Tree | None = None

    # ------------------------------------------------------------ parameters
    def _pull_params(self) -> bool:
        params, info = self.params.fetch()
        if params is None:
            return False
        self.policy.load_params(params, info.version)
        log.debug("agent %d: loaded parameters v%d (%.2fs after publish)", self.agent_id, info.version,
                  time.time() - info.time)
        return True

    def _wait_for_first_params(self) -> bool:
        """Block until the learner has published once (or a stop); True when loaded."""
        backoff = Backoff(0.05, 1.0)
        while not self.stop:
            if self._check_control():
                return False
            if self._pull_params():
                return True
            self.stop.wait(backoff.next_delay())
        return False

    def _check_control(self) -> bool:
        stopping, reason = self.control.stopping()
        if stopping:
            self.stop.set(f"run stopping ({reason or 'stop requested'})")
        return stopping

    # ------------------------------------------------------------ loop
    def run(self) -> int:
        """Step until stopped; returns the process exit code (0 on a clean stop)."""
        log.info("agent %d: %s with %d env(s), shard %d", self.agent_id, self.config.env.env_id,
                 self.num_envs, self.sender.shard)
        guard = OutageGuard(f"agent {self.agent_id}", self.stop, errors=OUTAGE_ERRORS)
        if guard.call(self._wait_for_first_params):
            self._loop()
        self._shutdown()
        return 0

    def _loop(self) -> None:
        cfg = self.config.agent
        obs, _ = self.envs.reset(seed=self.seed)
        for i in range(self.num_envs):
            self.policy.on_episode_start(i)
        self._last_obs = obs
        next_poll = self.steps + cfg.fetch_every_steps * self.num_envs
        next_episode_poll = self.num_episodes + (cfg.fetch_every_episodes or 0)
        next_beat = 0.0
        while not self.stop:
            self.policy.before_act(obs, ActMode.TRAINING)
            output = self.policy.act(obs, ActMode.TRAINING)
            self.policy.after_act(obs, output, ActMode.TRAINING)
            step = step_vector_env(self.envs, output.actions)
            try:
                # Blocks while Redis is out of memory or unreachable (up to sender.max_wait_s);
                # after that the chunks are dropped and counted, and the env loop goes on.
                self.sender.add(obs, output.actions, step.rewards, step.terminated, step.truncated,
                                with_final_rows(step.obs, step.final_obs), output.extras, self.policy.version)
            except HubUnavailableError as exc:
                log.warning("agent %d: %s", self.agent_id, exc)
            self.steps += self.num_envs
            obs = self._last_obs = step.obs
            if step.episodes:
                self._record_episodes(step.episodes)
            episodes_due = cfg.fetch_every_episodes is not None and self.num_episodes >= next_episode_poll
            if self.steps >= next_poll or episodes_due:
                next_poll = self.steps + cfg.fetch_every_steps * self.num_envs
                next_episode_poll = self.num_episodes + (cfg.fetch_every_episodes or 0)
                self._pull_params()  # never raises: an outage leaves the current parameters
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + cfg.heartbeat_every_s
                try:
                    self.heartbeat.beat(self.steps, self.num_episodes, self.policy.version, force=True)
                    self._check_control()
                except OUTAGE_ERRORS as exc:
                    log.warning("agent %d: heartbeat failed (%s)", self.agent_id, exc)

    def _record_episodes(self, episodes: dict) -> None:
        records = []
        for i, result in episodes.items():
            self.num_episodes += 1
            self.policy.on_episode_end(i, result.episode_return, result.episode_length)
            self.policy.on_episode_start(i)
            records.append(EpisodeRecord(str(self.agent_id), "train", result.episode_return,
                                         result.episode_length, self.policy.version, time.time()))
        try:
            self.episodes.record(records)
        except OUTAGE_ERRORS as exc:
            log.warning("agent %d: %d episode records lost (%s)", self.agent_id, len(records), exc)

    def _shutdown(self) -> None:
        """Send what is buffered (best effort: Redis may be gone) and leave the agents table."""
        try:
            if self.steps:  # stopped before its first step: nothing to send
                self.sender.flush(self._last_obs)
            self.heartbeat.remove()
        except OUTAGE_ERRORS as exc:
            log.warning("agent %d: could not flush on shutdown (%s); %d steps unsent", self.agent_id, exc,
                        self.sender.stats().steps_dropped)
        self.envs.close()
        stats = self.sender.stats()
        log.info("agent %d: stopped after %d steps, %d episodes; sender %s", self.agent_id, self.steps,
                 self.num_episodes, stats._asdict())
