"""The agent process: a stateless env loop that acts with the latest parameters and sends its
experience to the hub.

Per vector step: act (uniformly at random during an off-policy agent's warm-up, :mod:`.warmup`)
-> step -> ``sender.add`` (which flushes a chunk every ``flush_steps``);
a heartbeat and a look at the run's control state every ``agent.heartbeat_every_s``. Finished
episodes go to the episodes stream in batches. Parameters follow ``learner.on_policy_sync``
(docs/concepts.md, "On-policy production"): on grants (``lockstep``, ``overlap``) each flush is
claimed first (:class:`~surreal_redis.agent.claims.Claimer`); ``free`` polls the version every
``agent.fetch_every_steps`` steps (or ``fetch_every_episodes``) and after every flush that waited
on the learner's backlog (``hub.sender.max_lag``).

A Redis outage is ridden out with capped backoff (its experience is dropped and counted, never
duplicated); the first SIGTERM/SIGINT or a ``stop`` flushes and exits 0 (noticed within a second,
waits included), the second exits at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import redis

from surreal_redis.agent.claims import Claimer
from surreal_redis.agent.warmup import agent_warmup
from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy
from surreal_redis.algos.policies import make_policy
from surreal_redis.codec import Tree
from surreal_redis.config import ExperimentConfig
from surreal_redis.connection import Backoff, RedisClient
from surreal_redis.envs import make_vector_env, step_vector_env
from surreal_redis.hub.experience.sender import ExperienceSender, HubUnavailableError, shard_peer_chunks
from surreal_redis.hub.params import ParameterClient, connect_replicas
from surreal_redis.hub.quota import ProductionQuota, QuotaNews
from surreal_redis.hub.run.control import RunControl, StopWatch
from surreal_redis.hub.run.episodes import EpisodeLog, EpisodeRecord
from surreal_redis.hub.run.heartbeat import Heartbeat
from surreal_redis.outage import OUTAGE_ERRORS as REDIS_OUTAGE_ERRORS
from surreal_redis.outage import OutageGuard
from surreal_redis.runtime import StopFlag
from surreal_redis.seeds import agent_seeds
from surreal_redis.trees import tree_map

log = logging.getLogger(__name__)

OUTAGE_ERRORS = (*REDIS_OUTAGE_ERRORS, HubUnavailableError)
# A heartbeat or episode write that fails for these is skipped (the next heartbeat replaces it) or
# kept for the next try: neither is worth stopping the env loop for.
WRITE_SKIP_ERRORS = (*OUTAGE_ERRORS, redis.exceptions.OutOfMemoryError)
EPISODE_BUFFER = 1000  # episode records kept while Redis refuses them; beyond that the oldest are lost
EPISODE_BATCH = 64  # episode records waiting that are sent without waiting for a flush or heartbeat
FIRST_PARAMS_POLL_CAP_S = 0.1  # the longest wait between looks for the learner's first parameters


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

    def __init__(self, config: ExperimentConfig, client: RedisClient, agent_id: int, stop: StopFlag) -> None:
        if agent_id < 0:
            raise ValueError(f"agent id must be >= 0, got {agent_id}")
        self.config, self.agent_id, self.stop = config, agent_id, stop
        seeds = agent_seeds(config.experiment.seed, agent_id)  # independent env and policy streams
        self.envs = make_vector_env(config.env, num_envs=config.env.num_envs, seed=seeds.envs, mode="train")
        self.num_envs = self.envs.num_envs
        self.policy: AgentPolicy = make_policy(config.algo_config, self.envs.single_observation_space,
                                               self.envs.single_action_space, self.num_envs, agent_id,
                                               config.agent.num_agents, seeds.policy, config.agent.inference)
        self.warmup = agent_warmup(config, agent_id, self.envs.single_action_space, self.num_envs)
        self.control = RunControl(client, config.run)
        self.stop_watch = StopWatch(stop, self.control)
        self.sender = ExperienceSender(client, config.hub.sender, config.run, agent_id, config.redis.num_shards,
                                       stop=self.stop_watch,
                                       peer_chunks=shard_peer_chunks(agent_id, config.agent.num_agents,
                                                                     config.redis.num_shards, self.num_envs))
        self.lockstep = config.lockstep
        self.claimer = Claimer(f"agent {agent_id}", ProductionQuota(client, config.run), QuotaNews(client, config.run),
                               self.stop_watch, config.hub.sender.flush_steps * self.num_envs,
                               held=lambda: self.policy.version, load=self._pull_params, beat=self._beat_if_due)
        self.params = ParameterClient(client, config.run, config.hub.params_client,
                                      connect_replicas(config.redis.param_read_urls, config.redis.settings()))
        self.heartbeat = Heartbeat(client, config.run, agent_id, config.agent.heartbeat_ttl_s)
        self.episodes = EpisodeLog(client, config.run, config.hub.episodes_maxlen)
        self._unsent_episodes: deque[EpisodeRecord] = deque()
        self.episodes_lost = 0  # records dropped from a full local buffer
        self.seed = seeds.envs
        self.steps = 0
        self.num_episodes = 0
        self._loop_started: float | None = None
        self._next_beat = 0.0
        self._last_obs: Tree | None = None

    def idle_seconds(self) -> float:
        """Seconds of the env loop spent not stepping: waiting on claims (the one under way
        included) and on backpressure."""
        return self.claimer.waited_s() + self.sender.stats().backpressure_wait_s

    def running_seconds(self) -> float:
        """Seconds since the env loop started (0 before)."""
        return 0.0 if self._loop_started is None else time.monotonic() - self._loop_started

    # ------------------------------------------------------------ parameters
    def _pull_params(self, live: int = 0) -> bool:
        """Load the published parameters if they changed; ``live``: a version a claim reported
        live (saves the version poll). True when new parameters were loaded."""
        params, info = self.params.fetch(at_least=live)
        if params is None:
            return False
        self.policy.load_params(params, info.version)
        self.warmup.loaded(info.iteration)
        log.debug("agent %d: loaded parameters v%d (%.2fs after publish)", self.agent_id, info.version,
                  time.time() - info.time)
        return True

    def _wait_for_first_params(self) -> bool:
        """Block until the learner has published once (or a stop); True when loaded. Polls every
        0.02-0.1 s: the run's first update waits for this (with a 1 s cap, agents that started a
        second before the learner's first publish saw it 0.4 s late on average)."""
        backoff = Backoff(0.02, FIRST_PARAMS_POLL_CAP_S)
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
        flush_steps = self.config.hub.sender.flush_steps
        obs, _ = self.envs.reset(seed=self.seed)
        for i in range(self.num_envs):
            self.policy.on_episode_start(i)
        self._last_obs = obs
        self._loop_started = time.monotonic()
        next_poll = self.steps + cfg.fetch_every_steps * self.num_envs
        next_episode_poll = self.num_episodes + (cfg.fetch_every_episodes or 0)
        flush_step = 0  # vector steps into the current flush
        learner_waits = self.sender.learner_waits
        while not self.stop:
            if self.lockstep and flush_step == 0 and not self.claimer.claim_flush():
                break
            output = self.warmup.act() if self.warmup.left else self._act(obs)
            step = step_vector_env(self.envs, output.actions)
            # Blocks while Redis is out of memory or unreachable (up to sender.max_wait_s);
            # after that the chunks are dropped and counted, and the env loop goes on.
            self._send(self.sender.add, obs, output.actions, step.rewards, step.terminated, step.truncated,
                       with_final_rows(step.obs, step.final_obs), output.extras, self.policy.version)
            self.steps += self.num_envs
            obs = self._last_obs = step.obs
            flush_step += 1
            if step.episodes:
                self._record_episodes(step.episodes)
            if self.lockstep and flush_step == flush_steps:
                # Send the claimed chunks now (the sender alone would wait for the next step, which
                # needs the next claim, which needs the learner to have these chunks).
                flush_step = 0
                self._send(self.sender.flush, obs)
                self.claimer.sent()
                if self._unsent_episodes:
                    self._send_episodes()
            for i in step.final_obs:  # a lost life with episodic life too: as the learner's targets reset
                self.policy.on_episode_start(i)
            episodes_due = cfg.fetch_every_episodes is not None and self.num_episodes >= next_episode_poll
            waited = self.sender.learner_waits != learner_waits  # the learner updated meanwhile
            learner_waits = self.sender.learner_waits
            if not self.lockstep and (self.steps >= next_poll or episodes_due or waited):
                next_poll = self.steps + cfg.fetch_every_steps * self.num_envs
                next_episode_poll = self.num_episodes + (cfg.fetch_every_episodes or 0)
                self._pull_params()  # never raises: an outage leaves the current parameters
            self._beat_if_due()

    def _act(self, obs: Tree) -> ActionOutput:
        self.policy.before_act(obs, ActMode.TRAINING)
        output = self.policy.act(obs, ActMode.TRAINING)
        self.policy.after_act(obs, output, ActMode.TRAINING)
        return output

    def _send(self, send, *args) -> None:
        try:
            send(*args)
        except HubUnavailableError as exc:
            log.warning("agent %d: %s", self.agent_id, exc)

    def _beat_if_due(self) -> None:
        """Heartbeat and a look at the run's control state every ``agent.heartbeat_every_s``."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + self.config.agent.heartbeat_every_s
        try:
            self.heartbeat.beat(self.steps, self.num_episodes, self.policy.version, force=True,
                                idle_s=self.idle_seconds(), running_s=self.running_seconds(),
                                param_rejections=self.params.rejections,
                                chunks_dropped=self.sender.stats().chunks_dropped, claimed=self.claimer.claimed)
            self._check_control()
        except WRITE_SKIP_ERRORS as exc:  # skipped: the next heartbeat replaces it
            log.warning("agent %d: heartbeat skipped (%s)", self.agent_id, exc)
        if self._unsent_episodes:
            self._send_episodes()

    def _record_episodes(self, episodes: dict) -> None:
        """Record the finished episodes (their envs start again in the loop, lost lives included).
        They are sent after each claimed flush, with each heartbeat or once ``EPISODE_BATCH``
        wait: one write per episode end would be a round trip every few steps."""
        for i, result in episodes.items():
            self.num_episodes += 1
            self.policy.on_episode_end(i, result.episode_return, result.episode_length)
            self._unsent_episodes.append(EpisodeRecord(str(self.agent_id), "train", result.episode_return,
                                                       result.episode_length, self.policy.version, time.time()))
        excess = len(self._unsent_episodes) - EPISODE_BUFFER
        if excess > 0:
            self.episodes_lost += excess
            for _ in range(excess):
                self._unsent_episodes.popleft()
            log.warning("agent %d: %d episode records lost (local buffer of %d full)", self.agent_id, excess,
                        EPISODE_BUFFER)
        if len(self._unsent_episodes) >= EPISODE_BATCH:
            self._send_episodes()

    def _send_episodes(self) -> None:
        """Write the buffered episode records; those Redis refuses (full, unreachable) stay for the
        next try (after the next episode or heartbeat). A lost reply may store a record twice."""
        records = list(self._unsent_episodes)
        try:
            refused = self.episodes.record_some(records)
        except WRITE_SKIP_ERRORS as exc:
            log.warning("agent %d: %d episode records kept for later (%s)", self.agent_id, len(records), exc)
            return
        self._unsent_episodes = deque(refused)

    def _shutdown(self) -> None:
        """Send what is buffered (best effort: Redis may be gone) and leave the agents table."""
        try:
            self.sender.flush(self._last_obs)  # stopped before its first step: nothing to send
            if self._unsent_episodes:
                self._send_episodes()
            self.heartbeat.remove()
        except OUTAGE_ERRORS as exc:
            log.warning("agent %d: could not flush on shutdown (%s); %d steps unsent", self.agent_id, exc,
                        self.sender.stats().steps_dropped)
        self.claimer.close()
        self.sender.close()
        self.envs.close()
        stats = self.sender.stats()
        log.info("agent %d: stopped after %d steps, %d episodes, %.0f%% of %.0fs idle; sender %s", self.agent_id,
                 self.steps, self.num_episodes, 100 * self.idle_seconds() / max(self.running_seconds(), 1e-9),
                 self.running_seconds(), stats._asdict())
