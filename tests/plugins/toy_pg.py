"""A toy algorithm defined outside the package, to prove that adding one touches no package file:
REINFORCE (Williams 1992) with a linear softmax policy in numpy, on Discrete actions.

A run names this module in its config (``plugins: [toy_pg]``, the folder on ``PYTHONPATH``); every
process imports it before reading the config, and the ``register`` call below makes ``algo:
toy_pg`` and its ``toy_pg:`` section known. The learner trains it on-policy with lockstep grants,
checkpoints it and publishes its weights; agents and eval act with :class:`ToyPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from surreal_redis.algos.base import ActionOutput, ActMode, AgentPolicy, Trainer
from surreal_redis.algos.registry import register
from surreal_redis.algos.spec import AlgorithmSpec, PolicyRequest


@dataclass(frozen=True)
class ToyPGConfig:
    learning_rate: float = 0.01
    gamma: float = 0.99

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


def _logits(weights: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """obs ``[N, D]`` -> logits ``[N, A]`` of a linear policy with a bias column."""
    return np.concatenate([obs, np.ones((len(obs), 1), obs.dtype)], axis=1) @ weights


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


class ToyPGTrainer(Trainer):
    def __init__(self, config: ToyPGConfig, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.config = config
        self.weights = np.zeros((obs_space.shape[0] + 1, action_space.n), np.float32)
        self.iteration = 0

    def update(self, chunks: list) -> dict[str, float]:
        """One gradient ascent step on sum_t G_t * log pi(a_t | s_t), G_t the discounted reward to
        go inside each chunk (cut at episode ends and at the chunk's end: a toy, biased there).
        One epoch: each sample takes part in one gradient pass."""
        grad = np.zeros_like(self.weights)
        steps = 0
        for chunk in chunks:
            returns = np.zeros(chunk.num_steps, np.float32)
            running = 0.0
            for t in reversed(range(chunk.num_steps)):
                running = chunk.rewards[t] + self.config.gamma * running * (not (chunk.terminated[t] or chunk.truncated[t]))
                returns[t] = running
            obs = chunk.obs[:-1].astype(np.float32)
            probs = _softmax(_logits(self.weights, obs))
            onehot = np.eye(self.weights.shape[1], dtype=np.float32)[chunk.actions]
            features = np.concatenate([obs, np.ones((len(obs), 1), np.float32)], axis=1)
            advantages = returns - returns.mean()
            grad += features.T @ ((onehot - probs) * advantages[:, None])
            steps += chunk.num_steps
        self.weights += self.config.learning_rate * grad / max(1, steps)
        self.iteration += 1
        return {"losses/toy_grad_norm": float(np.linalg.norm(grad))}

    def actor_params(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights.copy()}

    def state_dict(self) -> dict[str, Any]:
        import torch  # checkpoints are torch archives read with the weights-only unpickler

        return {"weights": torch.from_numpy(self.weights.copy()), "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = state["weights"].numpy().astype(np.float32)
        self.iteration = int(state["iteration"])


class ToyPolicy(AgentPolicy):
    def __init__(self, obs_space: gym.Space, action_space: gym.Space, request: PolicyRequest) -> None:
        self.weights = np.zeros((obs_space.shape[0] + 1, action_space.n), np.float32)
        self.rng = np.random.default_rng(request.seed)

    def load_params(self, params: dict[str, np.ndarray], version: int) -> None:
        self.weights = np.asarray(params["weights"], np.float32).copy()
        self.version = version

    def act(self, obs: Any, mode: ActMode = ActMode.TRAINING) -> ActionOutput:
        probs = _softmax(_logits(self.weights, np.asarray(obs, np.float32)))
        if mode is ActMode.EVAL_DETERMINISTIC:
            return ActionOutput(probs.argmax(axis=1), {})
        draws = self.rng.random((len(probs), 1))
        return ActionOutput((probs.cumsum(axis=1) < draws).sum(axis=1).clip(0, probs.shape[1] - 1), {})


def _no_numpy_gap(section: ToyPGConfig) -> None:
    return None  # it only ever acts in numpy


SPEC = register(AlgorithmSpec(
    name="toy_pg", config_class=ToyPGConfig, on_policy=True,
    make_trainer=lambda section, obs_space, action_space, seed: ToyPGTrainer(section, obs_space, action_space),
    make_policy=lambda section, obs_space, action_space, request: ToyPolicy(obs_space, action_space, request),
    numpy_unsupported=_no_numpy_gap,
    summary="REINFORCE with a linear softmax policy (a test plug-in)"))
