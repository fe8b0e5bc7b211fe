"""Off-policy agents' random warm-up (``off_policy.random_steps``): uniform actions over the whole
action box for each agent's share of the run's first env steps, then the policy; never after
parameters from a learner that has updated, never in evals, never with ``random_steps: 0``."""

import dataclasses
import logging

import gymnasium as gym
import numpy as np
import pytest

from surreal_redis.agent import Agent
from surreal_redis.agent.warmup import RandomWarmup, agent_warmup
from surreal_redis.algos.learning import make_trainer
from surreal_redis.algos.policies import make_policy
from surreal_redis.algos.spec import ChunkNeeds
from surreal_redis.config import ExperimentConfig, load_config
from surreal_redis.configtools import ConfigError
from surreal_redis.envs import make_env
from surreal_redis.evaluator import Evaluator
from surreal_redis.hub.params import ParameterPublisher
from surreal_redis.runtime import StopFlag
from surreal_redis.seeds import agent_seeds, agent_warmup_seed

PENDULUM = {"sac": "sac_pendulum", "ddpg": "ddpg_pendulum"}  # one env per agent, actions in [-2, 2]


def pendulum(algo: str, *overrides: str) -> ExperimentConfig:
    return load_config(PENDULUM[algo], ["agent.num_agents=2", "off_policy.random_steps=200", *overrides])


class Hub:
    """The learner's side: the initial parameters of the config's algorithm, published on fakeredis."""

    def __init__(self, client, config: ExperimentConfig) -> None:
        env = make_env(config.env, 0)
        self.algo = make_trainer(config.with_overrides([f"{config.algo}.device=cpu"]).algo_config,
                                 env.observation_space, env.action_space)
        self.publisher = ParameterPublisher(client, config.run, config.hub.publisher)

    def publish(self, iteration: int) -> None:
        self.publisher.publish(self.algo.actor_params(), iteration, force=True)


def run_agent(client, config: ExperimentConfig, steps: int, agent_id: int = 1, iteration: int = 0,
              then=None) -> tuple[Agent, np.ndarray, list]:
    """Agent ``agent_id`` after ``steps`` vector steps with parameters of update ``iteration``
    published; the actions ``[steps, A]`` of its one env and the observations it acted on.
    ``then(step, hub)`` runs after each step."""
    hub = Hub(client, config)
    hub.publish(iteration)
    stop = StopFlag(install_handlers=False)
    agent = Agent(config, client, agent_id, stop)
    actions, observations = [], []

    def record(obs, action, *rest):  # in place of sender.add: the behaviour actions as sent
        observations.append(np.array(obs, copy=True))
        actions.append(np.array(action[0], copy=True))
        if then is not None:
            then(len(actions), hub)
        if len(actions) == steps:
            stop.set("test: enough steps")

    agent.sender.add = record
    assert agent.run() == 0
    return agent, np.array(actions), observations


def stream(config: ExperimentConfig, agent_id: int, steps: int) -> np.ndarray:
    """The first ``steps`` uniform actions of the agent's warm-up stream (one env)."""
    rng = np.random.default_rng(agent_warmup_seed(config.experiment.seed, agent_id))
    return np.array([rng.uniform(-2.0, 2.0, size=(1, 1))[0] for _ in range(steps)], dtype=np.float32)


def spread_over_the_box(actions: np.ndarray) -> bool:
    counts, _ = np.histogram(actions, bins=4, range=(-2.0, 2.0))
    return bool(counts.min() >= len(actions) // 10)  # uniform: a quarter in each quarter of [-2, 2]


def near_the_policy(actions: np.ndarray) -> bool:
    """The initial policies act near the middle: SAC's std ~0.22 before squashing, DDPG's noise 0.2."""
    return bool(np.mean(np.abs(actions) > 1.0) < 0.1)


@pytest.mark.parametrize("algo", ["sac", "ddpg"])
def test_an_agent_acts_uniformly_at_random_for_its_share_then_with_the_policy(fake_redis, algo):
    config = pendulum(algo)  # 200 random steps over 2 agents: 100 each
    agent, actions, _ = run_agent(fake_redis, config, steps=200)
    np.testing.assert_array_equal(actions[:100], stream(config, 1, 100))  # seeded: reproducible
    assert spread_over_the_box(actions[:100]) and np.abs(actions[:100]).max() <= 2.0
    assert near_the_policy(actions[100:]) and agent.warmup.left == 0


@pytest.mark.parametrize("algo", ["sac", "ddpg"])
def test_random_steps_0_acts_with_the_policy_from_the_first_step_as_before(fake_redis, algo):
    config = pendulum(algo, "off_policy.random_steps=0")
    agent, actions, observations = run_agent(fake_redis, config, steps=60)
    assert agent.warmup.left == 0 and near_the_policy(actions)
    # the same draws as a policy of the agent's seed acting on the same observations: no warm-up draw between
    env = make_env(config.env, 0)
    policy = make_policy(config.algo_config, env.observation_space, env.action_space, 1, 1, 2,
                         agent_seeds(config.experiment.seed, 1).policy, config.agent.inference)
    policy.load_params(agent.params.fetch(force=True)[0], 1)  # as the agent got them (the wire's dtype)
    policy.on_episode_start(0)
    np.testing.assert_array_equal(actions, [policy.act(obs).actions[0] for obs in observations])


def test_the_default_is_learning_starts_shared_by_the_agents(fake_redis):
    config = load_config("sac_pendulum", ["agent.num_agents=3"])  # learning_starts 1000
    assert config.off_policy.random_steps is None and config.off_policy.warmup_steps == 1000
    assert Agent(config, fake_redis, 0, StopFlag(install_handlers=False)).warmup.left == 334  # ceil(1000 / 3)
    assert Agent(load_config("smoke"), fake_redis, 0, StopFlag(install_handlers=False)).warmup.left == 0  # PPO


def test_an_agent_holding_parameters_of_a_learner_that_updated_never_acts_at_random(fake_redis):
    config = pendulum("sac")
    agent, actions, _ = run_agent(fake_redis, config, steps=60, iteration=7)  # restarted, or a resumed learner
    assert agent.warmup.left == 0 and near_the_policy(actions)
    assert not np.array_equal(actions[:10], stream(config, 1, 10))


def test_the_warm_up_ends_when_the_first_update_arrives(fake_redis):
    config = pendulum("sac", "agent.fetch_every_steps=10")
    published = []

    def first_update_at_step_20(step, hub):
        if step == 20:
            hub.publish(1)
            published.append(step)

    agent, actions, _ = run_agent(fake_redis, config, steps=90, then=first_update_at_step_20)
    assert published and agent.warmup.left == 0 and agent.policy.version == 2
    np.testing.assert_array_equal(actions[:20], stream(config, 1, 20))
    assert near_the_policy(actions[31:])  # polled within fetch_every_steps: far short of its 100


def test_eval_never_acts_at_random(fake_redis):
    config = pendulum("sac", "off_policy.random_steps=100000", "eval.episodes=1")
    evaluator = Evaluator(config, fake_redis, StopFlag(install_handlers=False))
    evaluator.policy.load_params(Hub(fake_redis, config).algo.actor_params(), 1)
    taken = []
    step = evaluator.env.step

    def recording(action):
        taken.append(np.array(action, copy=True))
        return step(action)

    evaluator.env.step = recording
    evaluator._evaluate(1)
    assert len(taken) == 200 and np.abs(np.array(taken)).max() < 0.5  # the initial mean, near the middle


def test_negative_random_steps_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"off_policy: random_steps must be >= 0 .*got -5$") as caught:
        load_config("sac_pendulum", ["off_policy.random_steps=-5"])
    assert "\n" not in str(caught.value)


def test_each_call_is_one_vector_step_of_uniform_actions():
    box = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 10.0], np.float32))
    warmup = RandomWarmup(box, num_envs=3, steps=10, seed=4)
    batches = []
    while warmup.left:
        batches.append(warmup.act().actions)
    actions = np.concatenate(batches)
    assert len(batches) == 4 and actions.shape == (12, 2) and actions.dtype == np.float32  # 10 -> 4 x 3 envs
    assert (actions >= box.low).all() and (actions <= box.high).all() and actions[:, 1].max() > 5.0
    discrete = RandomWarmup(gym.spaces.Discrete(3, start=2), num_envs=2, steps=100, seed=4)
    drawn = np.concatenate([discrete.act().actions for _ in range(50)])
    assert set(drawn.tolist()) == {2, 3, 4} and discrete.act().extras == {}
    warmup = RandomWarmup(box, 1, 10, seed=4)
    warmup.loaded(0)
    assert warmup.left == 10
    warmup.loaded(3)
    assert warmup.left == 0
    with pytest.raises(ValueError, match="finite bounds"):
        RandomWarmup(gym.spaces.Box(-np.inf, np.inf, (2,)), 1, 10, seed=0)


def test_no_warm_up_for_an_algorithm_whose_chunks_carry_extras(monkeypatch, caplog):
    config = pendulum("sac")
    spec = dataclasses.replace(config.algorithm, chunk_needs=lambda section, space: ChunkNeeds(extras=("logp",)))
    monkeypatch.setattr(ExperimentConfig, "algorithm", property(lambda self: spec))
    with caplog.at_level(logging.WARNING):
        assert agent_warmup(config, 0, gym.spaces.Box(-2.0, 2.0, (1,)), 1).left == 0
    assert "its chunks carry extras" in caplog.text
