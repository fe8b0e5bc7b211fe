"""Every random stream of a run's agents and evaluators, drawn from ``experiment.seed`` with
numpy's :class:`~numpy.random.SeedSequence`: each stream is the child of the run's sequence at a
spawn key naming its role, its process and its use (``SeedSequence(seed).spawn`` draws the same
children, in order), so no two streams share a seed (up to a collision of two 31-bit hashes), and
a fixed ``experiment.seed`` gives the same seeds in every run.

Integer seeds come out of :meth:`~numpy.random.SeedSequence.generate_state` below 2**31, a range
every env family's own seeding takes. A vector env seeds env ``i`` with ``env + i``: the
``num_envs`` consecutive integers of one agent stay apart from every other stream's by hashing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# the role, the first element of each spawn key
AGENT, EVALUATOR, FINAL_EVAL = 0, 1, 2
# the use, the last element: envs, the policy's random generator, eval episodes (then their number),
# an agent's random warm-up actions (off_policy.random_steps)
ENVS, POLICY, EPISODES, WARMUP = 0, 1, 2, 3
SEED_RANGE = 2**31 - 2**16  # env + i stays below 2**31 for up to 65536 envs


def stream_seed(base_seed: int, *spawn_key: int) -> int:
    """The integer seed of the stream at ``spawn_key`` (non-negative ints) under ``base_seed``
    (any int: a negative one is taken modulo 2**64), in ``[0, SEED_RANGE)``."""
    if any(key < 0 for key in spawn_key):
        raise ValueError(f"spawn key elements must be >= 0, got {spawn_key}")
    sequence = np.random.SeedSequence(base_seed % 2**64, spawn_key=spawn_key)
    return int(sequence.generate_state(1, np.uint64)[0] % SEED_RANGE)


class ProcessSeeds(NamedTuple):
    """The seeds of one agent or evaluator: ``envs`` (env ``i`` of a vector env: ``envs + i``) and
    ``policy`` (the agent policy's generator: exploration, sampled actions)."""

    envs: int
    policy: int


def agent_seeds(base_seed: int, agent_id: int) -> ProcessSeeds:
    """Agent ``agent_id``'s seeds."""
    return ProcessSeeds(stream_seed(base_seed, AGENT, agent_id, ENVS), stream_seed(base_seed, AGENT, agent_id, POLICY))


def agent_warmup_seed(base_seed: int, agent_id: int) -> int:
    """Agent ``agent_id``'s random warm-up actions (``off_policy.random_steps``): a stream of its
    own, so the policy's draws are those of a run without warm-up."""
    return stream_seed(base_seed, AGENT, agent_id, WARMUP)


def evaluator_seeds(base_seed: int, eval_id: int) -> ProcessSeeds:
    """Evaluator ``eval_id``'s seeds (its env, its policy); its episodes: :func:`eval_episode_seed`."""
    return ProcessSeeds(stream_seed(base_seed, EVALUATOR, eval_id, ENVS),
                        stream_seed(base_seed, EVALUATOR, eval_id, POLICY))


def eval_episode_seed(base_seed: int, eval_id: int, episode: int) -> int:
    """The reset seed of episode ``episode`` (0, 1, ...) of evaluator ``eval_id``."""
    return stream_seed(base_seed, EVALUATOR, eval_id, EPISODES, episode)


def final_eval_seeds(base_seed: int) -> ProcessSeeds:
    """The final eval's seeds (its env, its policy); its episodes: :func:`final_episode_seed`."""
    return ProcessSeeds(stream_seed(base_seed, FINAL_EVAL, ENVS), stream_seed(base_seed, FINAL_EVAL, POLICY))


def final_episode_seed(base_seed: int, episode: int) -> int:
    """The reset seed of episode ``episode`` of the final eval."""
    return stream_seed(base_seed, FINAL_EVAL, EPISODES, episode)
