"""A pixel learning check small enough for 2 cores: PPO learns, through the hub (sender ->
Redis -> receiver -> chunk check -> update -> parameters back), a task that needs the CNN and the
frame stack. A square moves across a 40x40 grayscale frame; the reward is for naming its
direction. One frame cannot tell the direction (random play and a blind policy score 8 of 16);
two frames (``frame_stack=2``, kept as separate frames) can. Atari Pong or Breakout would take
hours on these cores, and a 40x40 frame still goes through the Nature CNN."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from surreal_redis.agent import with_final_rows
from surreal_redis.algos.ppo.policy import PPOConfig, PPOPolicy
from surreal_redis.algos.ppo.trainer import PPOTrainer
from surreal_redis.envs import EnvConfig, make_vector_env, step_vector_env
from surreal_redis.hub.experience.receiver import ExperienceReceiver, ReceiverConfig
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.learner.chunk_check import ChunkCheck

ENV_ID = "SurrealMotion-v0"
SIZE, SQUARE, SPEED, LENGTH = 40, 4, 3, 16


class MotionEnv(gym.Env):
    """A bright square moving ``SPEED`` px per step left or right (bouncing off the edges) over
    a dark frame; action 1 says "right", 0 "left"; reward 1 when it names the current direction."""

    observation_space = gym.spaces.Box(0, 255, (SIZE, SIZE), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _frame(self) -> np.ndarray:
        frame = np.full((SIZE, SIZE), 20, np.uint8)
        frame[self.y:self.y + SQUARE, self.x:self.x + SQUARE] = 230
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.direction = int(self.np_random.choice([-1, 1]))
        self.x = int(self.np_random.integers(0, SIZE - SQUARE))
        self.y = int(self.np_random.integers(0, SIZE - SQUARE))
        return self._frame(), {}

    def step(self, action):
        reward = float((int(action) == 1) == (self.direction == 1))
        if not 0 <= self.x + SPEED * self.direction <= SIZE - SQUARE:
            self.direction = -self.direction
        self.x += SPEED * self.direction
        return self._frame(), reward, False, False, {}


@pytest.mark.slow
def test_ppo_learns_from_two_frames_through_the_hub(fake_redis):
    gym.register(ENV_ID, entry_point=MotionEnv, max_episode_steps=LENGTH)
    torch.manual_seed(0)  # network initialization
    try:
        envs = make_vector_env(EnvConfig(env_id=ENV_ID, frame_stack=2, num_envs=8), seed=0)
        config = PPOConfig(learning_rate=1e-3, hidden_sizes=(), update_epochs=4, num_minibatches=4, ent_coef=0.01,
                           gamma=0.9, device="cpu")
        policy = PPOPolicy(config, envs.single_observation_space, envs.single_action_space, num_envs=8, seed=0)
        algo = PPOTrainer(config, envs.single_observation_space, envs.single_action_space, device="cpu")
        policy.load_params(algo.actor_params(), 0)
        sender = ExperienceSender(fake_redis, SenderConfig(flush_steps=32), "motion", 0, 1)
        receiver = ExperienceReceiver(fake_redis, ReceiverConfig(), "motion", 1)
        check = ChunkCheck(envs.single_observation_space, envs.single_action_space, ("logp",))
        obs, _ = envs.reset(seed=0)
        returns: list[float] = []
        for update in range(1, 41):
            for _ in range(32):
                out = policy.act(obs)
                step = step_vector_env(envs, out.actions)
                sender.add(obs, out.actions, step.rewards, step.terminated, step.truncated,
                           with_final_rows(step.obs, step.final_obs), out.extras, policy.version)
                obs = step.obs
                returns += [episode.episode_return for episode in step.episodes.values()]
            sender.flush(obs)  # the 32 steps of every env go out now, completed by obs
            items = receiver.receive(100, 0)
            assert items and all(check.problem(item.chunk) is None for item in items)
            algo.update([item.chunk for item in items])
            receiver.ack(items)
            policy.load_params(algo.actor_params(), update)
            if len(returns) >= 32 and np.mean(returns[-32:]) >= 13.5:
                break
        assert np.mean(returns[-32:]) >= 13.5, f"mean return {np.mean(returns[-32:]):.1f} after {update} updates"
        assert np.mean(returns[:16]) < 11  # it started near chance (8)
    finally:
        del gym.registry[ENV_ID]
