"""The parameters the scale bench publishes: the real networks' (built in a spawned child, so
torch stays out of the bench's processes) and the float16 check of Pong's policy."""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from surreal_redis.codec import ParamDict
from surreal_redis.hub.params import from_wire, param_spec, to_wire

from ..bench_data import synthetic_trajectory
from .spec import PROFILES

log = logging.getLogger(__name__)


def real_params(env: str) -> ParamDict:
    """The parameters the PPO learner publishes for ``env`` (``actor_params()`` of a fresh
    ActorCritic as the shipped config builds it): Pong's Nature CNN with linear heads over 4
    stacked 84x84 frames and 6 actions (1.69M parameters); HalfCheetah's 256x256 relu MLPs with
    an observation normalizer (17 obs, 6 actions). Imports torch: call it in a child process
    (:func:`load_params`) so forked processes never inherit torch's threads."""
    import gymnasium as gym

    from surreal_redis.algos.networks import module_params
    from surreal_redis.algos.ppo.policy import ActorCritic
    from surreal_redis.algos.registry import algorithm

    section = algorithm("ppo").config_class  # the shipped PPO configs' section

    if env == "pong":
        frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)
        net = ActorCritic(section(hidden_sizes=()), gym.spaces.Tuple([frame] * 4), gym.spaces.Discrete(6))
    elif env == "halfcheetah":
        net = ActorCritic(section(hidden_sizes=(256, 256), activation="relu", normalize_obs=True),
                          gym.spaces.Box(-np.inf, np.inf, (17,), np.float32), gym.spaces.Box(-1, 1, (6,), np.float32))
    else:
        raise ValueError(f"unknown env {env!r} (known: {', '.join(PROFILES)})")
    return module_params("", net)


def trained_pong_params(updates: int = 12, seed: int = 0) -> ParamDict:
    """Pong's network (as :func:`real_params` builds it) after ``updates`` PPO updates (1e-3
    learning rate, 2 epochs of 2 minibatches, 4 envs x 64 steps each) on a paddle task over the
    synthetic Pong screens of :mod:`~harness.bench_data`: reward 1 for "up" (action 2)
    while the ball is above the left paddle's centre, for "down" (3) while below, 64-step episodes.
    The CNN has to find the ball and the paddle in the frames to earn it: 12 updates take the mean
    return from ~11 (chance) to ~50 of 64, the logits' spread from ~0.01 to ~6 nats. Trained
    weights for :func:`fp16_logit_check`; imports torch (call it in a child process, like
    :func:`real_params`); ~25 s of CPU."""
    import gymnasium as gym
    import torch

    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.algos.registry import algorithm
    from surreal_redis.testing.local_loop import LocalLoopConfig, OnPolicyLearner, run_local

    from ..bench_data import _Pong

    frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)

    class PaddleEnv(gym.Env):
        observation_space = gym.spaces.Tuple([frame] * 4)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
            super().reset(seed=seed)
            self.game, self.t = _Pong(self.np_random), 0
            self.stack = [self.game.frame()] * 4
            return tuple(self.stack), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            wanted = 2 if self.game.ball[0] < self.game.paddles[0] + 5 else 3
            reward = float(action == wanted)
            self.game.step()
            self.t += 1
            self.stack = self.stack[1:] + [self.game.frame()]
            return tuple(self.stack), reward, False, self.t >= 64, {}

    spec = algorithm("ppo")
    section = spec.config_class(hidden_sizes=(), learning_rate=1e-3, update_epochs=2, num_minibatches=2,
                                device="cpu")
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([PaddleEnv] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    trainer = spec.make_trainer(section, envs.single_observation_space, envs.single_action_space, seed)
    policy = NumpyPPOPolicy(section, envs.single_observation_space, envs.single_action_space, 4, seed=seed)
    loop = LocalLoopConfig(total_steps=4 * 64 * updates, chunk_steps=64, seed=seed, return_window=4,
                           log_every=max(1, updates // 3))
    result = run_local(cast(OnPolicyLearner, trainer), policy, envs, loop)
    envs.close()
    log.info("trained Pong network: mean return %.0f of 64 after %d updates", result.mean_return, result.updates)
    return trainer.actor_params()


def load_params(envs: Sequence[str]) -> dict[str, ParamDict]:
    """:func:`real_params` of each env, built in one spawned child (torch stays out of this
    process). Blocks for the child's torch import (a few seconds)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return {env: pool.apply(real_params, (env,)) for env in envs}


def fp16_logit_check(params: ParamDict, frames: int = 64, seed: int = 0) -> dict[str, float]:
    """How far Pong's policy (fresh, :func:`real_params`, or trained, :func:`trained_pong_params`)
    moves when its weights travel as float16: the numpy agent policy
    (``agent.inference: numpy``) loaded with ``params`` and with what a client loads when the
    publisher's ``dtype`` is float16 (:func:`~surreal_redis.hub.params.to_wire`, then
    :func:`~surreal_redis.hub.params.from_wire` back to float32), acting
    on ``frames`` synthetic Pong observations. Returns the largest logit and value differences
    (absolute, and relative to the fp32 logits' spread), the share of frames whose greedy action
    agrees, the largest log-prob difference (what PPO's ratio sees) and the largest
    KL(fp32 || fp16) of the action distributions (nats)."""
    import gymnasium as gym

    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.algos.registry import algorithm

    section = algorithm("ppo").config_class  # the shipped PPO configs' section

    frame = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    space = gym.spaces.Tuple([frame] * 4)
    traj = synthetic_trajectory("atari", num_envs=frames, steps=8, seed=seed)
    obs = traj.steps[-1].obs
    out: dict[str, np.ndarray] = {}
    rounded = from_wire(to_wire(params, "float16"), param_spec(params))
    for name, weights in (("fp32", params), ("fp16", rounded)):
        policy = NumpyPPOPolicy(section(hidden_sizes=()), space, gym.spaces.Discrete(6), num_envs=frames)
        policy.load_params(weights, 1)
        z = policy.encoder(obs)
        out[name + "_logits"] = policy.actor(z).astype(np.float64)
        out[name + "_value"] = policy.critic(z)[:, 0].astype(np.float64)
    a, b = out["fp32_logits"], out["fp16_logits"]
    log_p = a - np.logaddexp.reduce(a, axis=1, keepdims=True)
    log_q = b - np.logaddexp.reduce(b, axis=1, keepdims=True)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=1)
    spread = float(np.ptp(a)) or 1.0
    return {"frames": frames, "max_abs_logit_diff": float(np.abs(a - b).max()),
            "max_rel_logit_diff": float(np.abs(a - b).max() / spread),
            "max_abs_logp_diff": float(np.abs(log_p - log_q).max()),
            "max_abs_value_diff": float(np.abs(out["fp32_value"] - out["fp16_value"]).max()),
            "greedy_agreement": float((a.argmax(1) == b.argmax(1)).mean()), "max_kl": float(kl.max()),
            "logit_spread": spread}
