"""Synthetic vectorized experience for the benchmarks: CartPole-, Humanoid- and Atari-like.

The ALE is not installed, so Atari observations are synthetic 84x84 uint8 frames built like real
ones: a flat background with static borders and a score bar, two paddles and a ball that move
every step, and 4-frame stacks as a tuple of 4 frames that a reset fills with the reset frame
(like gymnasium's FrameStack). Such frames lz4-compress 20-60x, as real Pong/Breakout frames do,
so dedup and compression are measured on realistic bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from surreal_redis.trees import Tree, tree_leaves, tree_map

KINDS = ("cartpole", "humanoid", "atari")
_FRAME = 84
_STACK = 4


class VecStep(NamedTuple):
    """One step of N envs. ``obs`` is what the policy saw (tree, leaves ``[N, ...]``);
    ``actions`` ``[N, ...]``, ``rewards`` float32 ``[N]``, ``terminated``/``truncated`` bool
    ``[N]``; ``final_obs`` is None when no episode ended, else a tree like ``obs`` whose row i is
    the true last observation of env i if its episode ended at this step (its next ``obs`` row is
    then a reset; the other rows are zeros)."""

    obs: Tree
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: Tree | None


class Trajectory(NamedTuple):
    """``steps`` consecutive vectorized steps and the observation that followed the last one."""

    steps: list[VecStep]
    last_obs: Tree

    def next_obs(self, t: int, env: int) -> Tree:
        """The observation that followed env ``env``'s action at step ``t`` (final one if it ended)."""
        step = self.steps[t]
        if step.terminated[env] or step.truncated[env]:
            return index_tree(step.final_obs, env)
        following = self.steps[t + 1].obs if t + 1 < len(self.steps) else self.last_obs
        return index_tree(following, env)


def index_tree(tree: Tree, index: int) -> Tree:
    """Row ``index`` of every leaf of a tree of batched arrays."""
    return tree_map(lambda leaf: leaf[index], tree)


class _Pong:
    """One Atari-like game screen: flat regions, two paddles and a ball (frames of 7 KB)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.background = np.full((_FRAME, _FRAME), 87, np.uint8)
        self.background[:10] = 30  # score bar
        self.background[10:12] = self.background[-2:] = 236  # walls
        self.background[-4:-2] = rng.integers(60, 120, (2, _FRAME))  # textured ground: lz4 ratio ~25
        self.background[12:-4:4, 41] = 236  # dashed centre line
        self.score = 0
        self.reset()

    def reset(self) -> None:
        self.ball = self.rng.uniform([20, 30], [70, 54])
        self.velocity = self.rng.choice([-2.0, 2.0], size=2) * self.rng.uniform(0.6, 1.2, size=2)
        self.paddles = np.array([40.0, 40.0])
        self.score = 0

    def step(self) -> bool:
        """Advance one frame; True when the episode ends (3 points, ~200 steps)."""
        self.ball += self.velocity
        if not 12 <= self.ball[0] <= 80:
            self.velocity[0] *= -1
            self.ball[0] = np.clip(self.ball[0], 12, 80)
        if not 6 <= self.ball[1] <= 78:
            self.velocity[1] *= -1
            self.ball[1] = np.clip(self.ball[1], 6, 78)
            if self.rng.random() < 0.5:
                self.score += 1
        self.paddles += np.clip(self.ball[0] - self.paddles, -2, 2) + self.rng.normal(0, 0.5, size=2)
        self.paddles = np.clip(self.paddles, 12, 72)
        return self.score >= 3

    def frame(self) -> np.ndarray:
        screen = self.background.copy()
        y, x = int(self.ball[0]), int(self.ball[1])
        screen[y:y + 2, x:x + 2] = 236
        for column, top in zip((4, 78), self.paddles.astype(int)):
            screen[top:top + 10, column:column + 2] = 147
        screen[2:8, 20:20 + 4 * self.score] = 200  # the score digits change only on a point
        return screen


def _atari(num_envs: int, steps: int, rng: np.random.Generator) -> Trajectory:
    games = [_Pong(rng) for _ in range(num_envs)]
    stacks = [[g.frame()] * _STACK for g in games]

    def observe() -> tuple[np.ndarray, ...]:
        return tuple(np.stack([stack[k] for stack in stacks]) for k in range(_STACK))

    out = []
    for _ in range(steps):
        obs = observe()
        terminated = np.zeros(num_envs, bool)
        final_obs = None
        for i, game in enumerate(games):
            terminated[i] = game.step()
            stacks[i] = stacks[i][1:] + [game.frame()]
            if terminated[i]:
                final_obs = final_obs or tuple(np.zeros_like(frames) for frames in obs)
                for k in range(_STACK):
                    final_obs[k][i] = stacks[i][k]
                game.reset()
                stacks[i] = [game.frame()] * _STACK
        out.append(VecStep(obs, rng.integers(0, 6, num_envs), terminated.astype(np.float32),
                           terminated, np.zeros(num_envs, bool), final_obs))
    return Trajectory(out, observe())


def _vector(num_envs: int, steps: int, rng: np.random.Generator, dim: int, action_dim: int | None,
            end_prob: float, time_limit: int) -> Trajectory:
    """A smooth random walk in ``dim`` float32 dimensions, episodes ending at random (terminated)
    or at ``time_limit`` (truncated). ``action_dim`` None: one discrete action of 2."""
    state = rng.normal(0, 0.05, (num_envs, dim)).astype(np.float32)
    age = np.zeros(num_envs, int)
    out = []
    for _ in range(steps):
        obs = state.copy()
        state = state + rng.normal(0, 0.02, state.shape).astype(np.float32)
        age += 1
        terminated = rng.random(num_envs) < end_prob
        truncated = ~terminated & (age >= time_limit)
        ended = np.flatnonzero(terminated | truncated)
        final_obs = state.copy() if ended.size else None
        for i in ended:
            state[i] = rng.normal(0, 0.05, dim)
            age[i] = 0
        actions = (rng.integers(0, 2, num_envs) if action_dim is None
                   else rng.uniform(-1, 1, (num_envs, action_dim)).astype(np.float32))
        out.append(VecStep(obs, actions, np.ones(num_envs, np.float32), terminated, truncated, final_obs))
    return Trajectory(out, state.copy())


def synthetic_trajectory(kind: str, num_envs: int, steps: int, seed: int) -> Trajectory:
    """``steps`` vectorized steps of ``num_envs`` envs of ``kind`` (one of :data:`KINDS`):

    - ``cartpole``: obs float32 ``[N, 4]``, discrete actions ``[N]``, episodes ~60 steps;
    - ``humanoid``: obs float32 ``[N, 376]``, actions float32 ``[N, 17]``, truncated at 1000;
    - ``atari``: obs a tuple of 4 uint8 frames ``[N, 84, 84]``, discrete actions ``[N]``.
    """
    if num_envs < 1 or steps < 1:
        raise ValueError(f"need num_envs >= 1 and steps >= 1, got {num_envs}, {steps}")
    rng = np.random.default_rng(seed)
    if kind == "cartpole":
        return _vector(num_envs, steps, rng, 4, None, 1 / 60, 500)
    if kind == "humanoid":
        return _vector(num_envs, steps, rng, 376, 17, 1 / 400, 1000)
    if kind == "atari":
        return _atari(num_envs, steps, rng)
    raise ValueError(f"unknown observation kind {kind!r} (known: {', '.join(KINDS)})")


def obs_bytes(obs: Any) -> bytes:
    """The raw bytes of one (unbatched) observation tree, leaves concatenated (the naive wire)."""
    return b"".join(np.ascontiguousarray(leaf).tobytes() for leaf in tree_leaves(obs))
