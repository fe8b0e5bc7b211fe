"""A learner restarted into a Redis that filled up with a backlog while it was away: its
housekeeping (trim to retention.max_entries, gc of the observation blobs) runs before its first
publish, frees the memory, and the run goes on; the trimmed entries are counted, none lost silently.

(The memory must be in the backlog for the janitor to free it: 48 CartPole entries are ~40 KB,
less than the learner's own scripts and connections add, so a maxmemory set below what is used
minus that stays full whatever the janitor trims, and start() keeps retrying without dying.)"""

import threading

import numpy as np
import pytest

from surreal_redis.algos.learning import make_trainer
from surreal_redis.config import load_config
from surreal_redis.envs import make_env
from surreal_redis.hub.experience.sender import ExperienceSender, HubUnavailableError, SenderConfig
from surreal_redis.keys import RunKeys
from surreal_redis.learner.chunk_check import ChunkCheck
from surreal_redis.learner.loop import Learner
from surreal_redis.learner.parts import FeedSettings, LearnerParts, make_feed
from surreal_redis.runtime import StopFlag

from .conftest import add_steps

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def cartpole_learner(tmp_path, client) -> Learner:
    """The smoke config's CartPole PPO learner, in process, keeping at most 8 entries per shard."""
    config = load_config("smoke", [f"experiment.root={tmp_path}", "experiment.name=full_restart",
                                   "tracking.enabled=false", "ppo.device=cpu", "ppo.hidden_sizes=[16, 16]",
                                   "hub.retention.max_entries=8", "stop.max_env_steps=null", "stop.max_seconds=null"])
    env = make_env(config.env, seed=0)
    section = config.algo_config
    parts = LearnerParts(make_trainer(section, env.observation_space, env.action_space, seed=0),
                         make_feed(section, FeedSettings.of(config), seed=0),
                         ChunkCheck.for_experiment(config, env.observation_space, env.action_space))
    env.close()
    return Learner(config, client, StopFlag(install_handlers=False), parts)


def test_a_learner_restarted_into_a_full_redis_frees_the_backlog_and_publishes(real_redis, tmp_path):
    learner = cartpole_learner(tmp_path, real_redis)
    config = learner.config
    keys = RunKeys(config.run).shard(0)
    real_redis.config_set("maxmemory", real_redis.info("memory")["used_memory"] + (3 << 20))
    sender = ExperienceSender(real_redis, SenderConfig(flush_steps=2, max_wait_s=0.2, retry_base_s=0.01,
                                                       retry_cap_s=0.05), config.run, 0, 1)
    rng = np.random.default_rng(0)
    with pytest.raises(HubUnavailableError):  # the agents filled Redis up while no learner ran
        for flush in range(1000):
            add_steps(sender, 2 * flush, 2, rng)
    backlog = 2 * real_redis.llen(keys.inbox)  # queued batches of one chunk per env, none moved yet
    assert backlog >= 48 and not real_redis.exists(keys.exp) and sender.stats().oom_retries > 0

    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(learner.start()), daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        learner.stop.set("test")
        thread.join(timeout=10)
    assert outcome == [True], "start() did not publish within 60 s"
    assert learner.param_version == 1 and real_redis.exists(RunKeys(config.run).params.blob(1))
    # trimmed to about the cap, every dropped entry counted: an approximate trim removes whole stream
    # nodes (4 KB: ~13 of these entries), so under the cap in the last node and the whole one before
    # it may stay (188 entries left 20)
    left = real_redis.xlen(keys.exp)
    assert left <= 8 + 16
    assert sender.stats().chunks == left + learner.janitor.unread_dropped_total
    assert sender.stats().chunks_dropped == 2  # the flush the full Redis refused for max_wait_s
    assert real_redis.zcard(keys.obsref) <= 3 * left  # 3 frames per kept entry; the dropped ones went too
