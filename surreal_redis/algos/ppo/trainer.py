"""PPO learner: GAE over chunks, then clipped-surrogate or adaptive-KL updates, top to bottom like
CleanRL's ``ppo.py`` (the pure math is in :mod:`surreal_redis.algos.ppo.losses`). Differences from
CleanRL, each on purpose:

- ``terminated`` and ``truncated`` stay apart: a truncated episode is bootstrapped from V of its
  true final observation (as SB3), and a chunk's end from V of ``obs[T]``.
- Values are recomputed by the learner at the start of each update (the agents' parameters may
  lag, and the LSTM must be re-run anyway); the ratio uses the agents' behaviour log-probs.
- The z-filter is updated *after* the gradient steps, so the log-probs recomputed here use the
  same statistics as the agents that produced the data (ratio 1 on fresh data).
- Rewards are scaled by the learner (``normalize_reward``; CleanRL wraps its envs in
  ``NormalizeReward``) with the rule of that wrapper: each step's return joins the statistics,
  then that step's reward is scaled with them, so the scaler takes a batch in *before* its
  gradient steps and the first update already trains on scaled rewards.
- ``mode="adapt"`` replaces the clipped surrogate by the KL-penalized one of Schulman et al.
  2017 (section 4), with the KL measured against the network at the start of the update
  (SURREAL's ``ref_target_model``).

What the update trains towards is one method, :meth:`PPOTrainer._targets` (here GAE): a
subclass replaces it and keeps the rest (APPO's V-trace, :mod:`surreal_redis.algos.appo`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Distribution, kl_divergence

from surreal_redis.algos.base import ParamDict, Trainer
from surreal_redis.algos.capture import Capture, capture_wanted
from surreal_redis.algos.networks import adam, clip_grad_norm, module_params, obs_to_tensor, resolve_device
from surreal_redis.algos.normalizer import RewardScaler
from surreal_redis.algos.ppo.config import PPOConfig
from surreal_redis.algos.ppo.losses import (
    adapt_kl_coef,
    clipped_surrogate_loss,
    compute_gae,
    explained_variance,
    kl_penalty_loss,
    mean_loss_terms,
    value_loss,
)
from surreal_redis.algos.ppo.policy import ActorCritic, LSTMState, PPOPolicy
from surreal_redis.algos.ppo.rollout import Targets, _flatten_time, _merge_steps, _Rollout
from surreal_redis.chunks import INITIAL_STATE, Chunk, SkippedSteps
from surreal_redis.codec import Tree
from surreal_redis.trees import tree_leaves, tree_map, tree_stack

__all__ = ["PPOTrainer", "PPOConfig", "PPOPolicy", "Targets"]

log = logging.getLogger(__name__)

# Observation bytes per network pass: the no-grad pass over a rollout and each minibatch's
# gradient passes take rows in slices of about this much input, so the learner's peak memory does
# not grow with the batch (pixels become 4x larger as floats, plus activations).
PASS_OBS_BYTES = 2 << 20


def _rows_per_pass(obs: Tree, row_dims: int) -> int:
    """Rows of ``obs`` (leaves ``[*rows, ...]`` with ``row_dims`` leading row axes) that hold about
    :data:`PASS_OBS_BYTES` of observations; at least 1."""
    row_bytes = sum(math.prod(leaf.shape[row_dims:]) * leaf.element_size() for leaf in tree_leaves(obs))
    return max(1, PASS_OBS_BYTES // max(1, row_bytes))


class PPOTrainer(Trainer):
    """Learner side of PPO: one :meth:`update` per batch of chunks, which carry the extras
    :class:`PPOPolicy` produces (the spec's ``chunk_needs``)."""

    targets_read_logp = False
    """Whether :meth:`_targets` reads ``target_logp``; False: the no-grad pass over a rollout skips
    the policy head unless ``mode="adapt"`` needs it (PPO's GAE reads values only)."""

    def __init__(self, config: PPOConfig, obs_space: gym.Space, action_space: gym.Space,
                 device: str | torch.device | None = None, seed: int = 0,
                 compile_backend: str | Callable[..., Any] = "inductor") -> None:
        self.config = config
        self.device = resolve_device(config.device if device is None else device)
        self.net = ActorCritic(config, obs_space, action_space).to(self.device)
        self._params = list(self.net.parameters())  # gathered once: the walk costs ~30 us a step
        self.optimizer = adam(self._params, lr=config.learning_rate, eps=1e-5)
        self.reward_scaler = (RewardScaler(config.gamma, config.reward_clip).to(self.device)
                              if config.normalize_reward else None)
        self._action_start = int(action_space.start) if isinstance(action_space, gym.spaces.Discrete) else 0
        self.kl_coef = config.kl_coef_init
        self._capture = (Capture({"loss": self._minibatch_loss}, self.device, compile_backend)
                         if capture_wanted(config.compile, self.device) else None)
        self.iteration = 0
        self._generator = torch.Generator().manual_seed(seed)  # minibatch shuffling
        log.info("PPO (%s mode) on %s: %d parameters", config.mode, self.device,
                 sum(p.numel() for p in self.net.parameters()))

    def _rollout(self, chunks: list[Chunk], rewards: list[np.ndarray] | None = None) -> _Rollout:
        """Tensors, values and advantages for equal-length chunks (no gradients); ``rewards`` (one
        ``[T]`` array per chunk) replace the chunks' own, e.g. by the scaled ones."""
        dev = self.device
        steps, batch = chunks[0].num_steps, len(chunks)

        def stacked(arrays: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.stack(arrays, axis=1), dtype=dtype, device=dev)

        obs = obs_to_tensor(tree_stack(lambda leaves: np.stack(leaves, axis=1), [c.obs for c in chunks]), dev)
        if self.net.continuous:
            if any("raw_action" not in c.extras for c in chunks):
                raise ValueError("PPO with a Box action space needs extras['raw_action'] (the unclipped sample)")
            actions = stacked([c.extras["raw_action"] for c in chunks], torch.float32)
        else:
            actions = stacked([c.actions for c in chunks], torch.int64) - self._action_start
        logp = stacked([c.extras["logp"] for c in chunks], torch.float32)
        reward_batch = stacked([c.rewards for c in chunks] if rewards is None else rewards, torch.float32)
        terminated = stacked([c.terminated for c in chunks], torch.bool)
        truncated = stacked([c.truncated for c in chunks], torch.bool)
        # the state is reset before the step that follows an episode end: [T+1, B]
        episode_start = torch.zeros(steps + 1, batch, dtype=torch.bool, device=dev)
        episode_start[1:] = terminated | truncated
        state: LSTMState | None = None
        if self.net.lstm is not None:
            if any(INITIAL_STATE not in c.extras for c in chunks):
                raise ValueError("PPO with use_lstm needs extras['initial_state'] in every chunk")
            hidden, cell = (torch.as_tensor(np.stack([c.extras[INITIAL_STATE][key] for c in chunks]),
                                            dtype=torch.float32, device=dev) for key in ("lstm_h", "lstm_c"))
            state = (hidden, cell)

        with torch.no_grad():
            # one pass over obs[0..T]: values of every step, the chunk-end bootstrap V(obs[T])
            z, states = self.net.core(self._features_no_grad(_flatten_time(obs)), state, episode_start)
            all_values = self.net.value(z).reshape(steps + 1, batch)
            if self.config.mode == "adapt" or self.targets_read_logp:
                ref_head = self.net.policy_head(z).reshape(steps + 1, batch, -1)[:steps]
                target_logp = self._distribution(_flatten_time(ref_head), actions)[1].reshape(steps, batch)
            else:  # neither the KL penalty nor the targets read the policy at the update's start
                ref_head, target_logp = z.new_empty(steps, batch, 0), torch.empty(0)
            next_values = all_values[1:].clone()
            # episodes that ended inside the chunk: bootstrap from their true final observation,
            # continuing the LSTM from the state after step t (before the reset)
            ends = [(t, b) for b, c in enumerate(chunks) for t in sorted(c.final_obs)]
            if ends:
                t_idx = torch.tensor([t for t, _ in ends], device=dev)
                b_idx = torch.tensor([b for _, b in ends], device=dev)
                final_obs = obs_to_tensor(tree_stack(np.stack, [chunks[b].final_obs[t] for t, b in ends]), dev)
                end_state = None if states is None else (states[0][t_idx, b_idx], states[1][t_idx, b_idx])
                no_start = torch.zeros(1, len(ends), dtype=torch.bool, device=dev)
                z_final, _ = self.net.core(self.net.features(final_obs), end_state, no_start)
                next_values[t_idx, b_idx] = self.net.value(z_final)
            received_logp = self._received_logp(_flatten_time(obs), state, episode_start, actions, target_logp)
            targets = self._targets(reward_batch, all_values[:steps], next_values, terminated, truncated, logp,
                                    target_logp, received_logp=received_logp)
        reference_logp = logp if targets.proximal_logp is None else targets.proximal_logp
        return _Rollout(tree_map(lambda v: v[:steps], obs), actions, reference_logp, targets.advantages, targets.returns,
                        all_values[:steps], ref_head, episode_start[:steps], targets.diagnostics, state)

    def _received_logp(self, flat_obs: Tree, state: LSTMState | None, episode_start: torch.Tensor,
                       actions: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[T, B]`` of ``actions`` under the network as the agents receive it (its
        parameters through the ``wire_dtype`` rounding); ``flat_obs`` ``[(T+1)*B, ...]``,
        ``episode_start`` ``[T+1, B]``. PPO reads no log-prob in its targets: ``target_logp``."""
        return target_logp

    def _targets(self, rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                 terminated: torch.Tensor, truncated: torch.Tensor, behaviour_logp: torch.Tensor,
                 target_logp: torch.Tensor, received_logp: torch.Tensor | None = None) -> Targets:
        """Advantages and value targets, all ``[T, B]`` (no gradients), from the network's
        ``values``, ``next_values`` (as :func:`compute_gae` reads them) and ``target_logp`` at the
        start of the update (empty unless :attr:`targets_read_logp`), and the agents'
        ``behaviour_logp``; ``received_logp``: the same network's log-probs as the agents would
        compute them (:meth:`_received_logp`; None: ``target_logp``), for diagnostics that compare
        with the agents. PPO: GAE(lambda), which reads no log-prob."""
        cfg = self.config
        advantages, returns = compute_gae(rewards, values, next_values, terminated, truncated, cfg.gamma,
                                          cfg.gae_lambda)
        return Targets(advantages, returns, {})

    def _features_no_grad(self, flat_obs: Tree, net: ActorCritic | None = None) -> torch.Tensor:
        """``net.features`` (default: the learner's network) of ``[N, ...]`` leaves, in slices of
        about :data:`PASS_OBS_BYTES` of observations (pixels are turned into floats a slice at a time)."""
        net = self.net if net is None else net
        total, rows = len(tree_leaves(flat_obs)[0]), _rows_per_pass(flat_obs, 1)
        if rows >= total:
            return net.features(flat_obs)
        return torch.cat([net.features(tree_map(lambda v, i=i: v[i:i + rows], flat_obs))
                          for i in range(0, total, rows)])

    def _distribution(self, head: torch.Tensor, actions: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """The action distribution of policy-head outputs ``[N, A]`` (with the current log-std)
        and its log-probs ``[N]`` of ``actions`` ``[T, B, ...]`` (N = T*B)."""
        dist = self.net.distribution(head, validate=False)  # no host sync: NaNs show in mean_loss_terms
        return dist, dist.log_prob(_flatten_time(actions))

    def _minibatch_step(self, rollout: _Rollout, idx: torch.Tensor, ref_log_std: torch.Tensor | None,
                        coefs: tuple[Any, Any], stats: bool = True) -> dict[str, torch.Tensor]:
        """One optimizer step on the sequences ``idx`` of ``rollout``; returns the loss terms as
        float64 scalar tensors, not read: no host sync inside the step (:func:`.losses.mean_loss_terms`);
        ``stats`` False: none (``{}``), and the step makes none of the ops that only report.
        ``coefs``: this update's clip range and KL coefficient (floats, or tensors when captured).

        The minibatch goes through the network in passes of about :data:`PASS_OBS_BYTES` of
        observations, each pass's loss weighted by its share of the rows: every loss term is a
        mean over rows (advantages normalized with the whole minibatch's statistics), so the
        summed gradient is the whole minibatch's while activations are held one pass at a time."""
        # the whole batch in one step: its order changes no mean, so the rollout is used as it is
        whole = len(idx) == rollout.logp.shape[1]
        advantages = rollout.advantages if whole else rollout.advantages[:, idx]
        adv_stats = None
        if self.config.norm_adv and advantages.numel() > 1:
            adv_stats = advantages.mean(), advantages.std()
        steps = rollout.logp.shape[0]  # sequence length (1 without an LSTM)
        passes = math.ceil(len(idx) * steps / _rows_per_pass(rollout.obs, 2))
        parts = idx.tensor_split(min(passes, len(idx)))
        select = (lambda part: rollout) if whole and len(parts) == 1 else rollout.select
        loss_fn = self._minibatch_loss
        if self._capture is not None:
            capture = self._capture
            capture.warm_up(lambda: capture["loss"](select(parts[0]), ref_log_std, coefs, adv_stats)[0]
                            .backward(), self.optimizer.zero_grad)
            loss_fn = capture["loss"]
        self.optimizer.zero_grad()
        info: dict[str, torch.Tensor] = {}
        for part in parts:
            weight = len(part) / len(idx)
            if self._capture is not None:
                self._capture.step_begin()
            loss, part_info = loss_fn(select(part), ref_log_std, coefs, adv_stats)
            if len(parts) == 1:  # the usual case: no weighting, fewer small ops per step
                loss.backward()
                if stats:
                    info = {key: value.double() for key, value in self._with_ratio_stats(part_info, coefs).items()}
            else:
                (loss * weight).backward()
                for key, value in (self._with_ratio_stats(part_info, coefs) if stats else {}).items():
                    # float64 as the Python floats these were: 0.0 + weight * value, the same rounding
                    info[key] = info.get(key, 0.0) + weight * value.double()
        clip_grad_norm(self._params, self.config.max_grad_norm)
        self.optimizer.step()
        return info

    def _minibatch_loss(self, mb: _Rollout, ref_log_std: torch.Tensor | None, coefs: tuple[Any, Any],
                        adv_stats: tuple[torch.Tensor, torch.Tensor] | None,
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss of ``mb`` (means over its rows) and its terms (detached scalar tensors, not read);
        ``adv_stats`` (mean, std) normalize the advantages (None: used as they are)."""
        cfg, (clip_coef, kl_coef) = self.config, coefs
        z, _ = self.net.core(self.net.features(_flatten_time(mb.obs)), mb.initial_state, mb.episode_start)
        head = self.net.policy_head(z)
        if cfg.mode == "clip":  # no distribution object: the log-probs and entropy are all the loss reads
            new_logp, entropy = self.net.log_prob_entropy(head, _flatten_time(mb.actions), grad=cfg.ent_coef != 0)
        else:
            dist, new_logp = self._distribution(head, mb.actions)
            entropy = dist.entropy().mean()
        new_values = self.net.value(z)
        logratio = new_logp - mb.logp.reshape(-1)

        advantages = mb.advantages.reshape(-1)
        if adv_stats is not None:
            advantages = (advantages - adv_stats[0]) / (adv_stats[1] + 1e-8)
        info = {}
        if cfg.mode == "clip":
            pg_loss = clipped_surrogate_loss(logratio, advantages, clip_coef)
        else:
            ref_dist = self.net.distribution(_flatten_time(mb.ref_head), ref_log_std, validate=False)
            kl = kl_divergence(ref_dist, dist)
            pg_loss = kl_penalty_loss(logratio, advantages, kl, kl_coef)
            info["kl"] = kl.detach().mean()
        v_clip = clip_coef if cfg.mode == "clip" and cfg.clip_vloss else None
        v_loss = value_loss(new_values, mb.returns.reshape(-1), mb.values.reshape(-1), v_clip)
        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        info.update(policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), entropy=entropy.detach(),
                    logratio=logratio.detach())
        return loss, info

    @staticmethod
    @torch.no_grad()
    def _with_ratio_stats(terms: dict[str, torch.Tensor], coefs: tuple[Any, Any]) -> dict[str, torch.Tensor]:
        """``terms`` of :meth:`_minibatch_loss` with its ``logratio`` ``[N]`` replaced by the
        scalars they report: ``approx_kl`` and ``clip_fraction`` (of ratios moved past the clip range)."""
        terms = dict(terms)
        logratio = terms.pop("logratio")
        ratio = logratio.exp()
        # the k3 estimator of KL[pi_old, pi], http://joschu.net/blog/kl-approx.html
        terms["approx_kl"] = ((ratio - 1) - logratio).mean()
        terms["clip_fraction"] = ((ratio - 1.0).abs() > coefs[0]).float().mean()
        return terms

    def schedule_done(self) -> str:
        """Why the next update would learn nothing ("" while it would): ``total_updates`` updates
        done under ``anneal_lr`` or ``anneal_clip``, whose learning rate or clip range is 0 from
        there (a clip range of 0 clips every ratio that moves: the policy stays where it is)."""
        cfg = self.config
        if (cfg.anneal_lr or cfg.anneal_clip) and cfg.total_updates and self.iteration >= cfg.total_updates:
            annealed = " and ".join(name for name, on in (("learning rate", cfg.anneal_lr),
                                                          ("clip range", cfg.anneal_clip)) if on)
            return f"the annealing schedule ended: {self.iteration} updates (total_updates {cfg.total_updates}), {annealed} 0"
        return ""

    def update(self, chunks: list[Chunk]) -> dict[str, float]:
        """One PPO iteration on ``chunks``: the reward scaler takes their rewards in and scales
        them, the gradient steps run, then the z-filter takes their observations in.

        The epochs: ``update_epochs`` (fewer only after a ``target_kl`` early stop), whatever the
        agents' speed: each sample takes part in ``update_epochs`` gradient passes, one per epoch
        (its minibatch's), as in synchronous PPO (Schulman et al. 2017, arXiv:1707.06347,
        Algorithm 1: K epochs of minibatch SGD on each batch).

        Returns the means over the last epoch's minibatches of ``policy_loss``, ``value_loss``,
        ``entropy``, ``approx_kl``, ``clip_fraction`` (and ``kl``, ``kl_coef`` in adapt mode, the
        coefficient used here; the next update uses the adapted one), plus
        ``explained_variance``, ``return_mean`` (of the value targets, in scaled reward units with
        ``normalize_reward``), ``learning_rate``, ``clip_coef`` (both as annealed for this update),
        ``epochs`` run and ``num_steps``, and the means of :meth:`_targets`' diagnostics.
        """
        if not chunks:
            raise ValueError("update needs at least one chunk")
        cfg = self.config
        annealing = cfg.anneal_lr or cfg.anneal_clip
        if annealing and not cfg.total_updates:
            raise ValueError("anneal_lr and anneal_clip need total_updates >= 1 (a learner derives it from "
                             "stop.max_env_steps: AlgorithmSpec.for_run), got 0")
        if annealing and self.iteration == cfg.total_updates:
            log.warning("update %d is past the annealing schedule (total_updates %d): learning rate and clip "
                        "range 0 from here", self.iteration + 1, cfg.total_updates)
        # CleanRL's linear schedules: the fraction of the budget (total_updates) still ahead
        remaining = max(0.0, 1.0 - self.iteration / cfg.total_updates) if cfg.total_updates else 1.0
        learning_rate = cfg.learning_rate * (remaining if cfg.anneal_lr else 1.0)
        clip_coef = cfg.clip_coef * (remaining if cfg.anneal_clip else 1.0)
        if cfg.anneal_lr:
            self.optimizer.param_groups[0]["lr"] = learning_rate

        rewards = [c.rewards for c in chunks]
        if self.reward_scaler is not None:
            # G runs per (agent, env) stream, so a stream's chunk continues where its previous one
            # left off however the streams interleave; the one variance is shared, like SB3's.
            rewards = self.reward_scaler.scale_chunks(rewards, [c.terminated | c.truncated for c in chunks],
                                                      [(c.agent_id, c.env_index) for c in chunks])
        by_length: dict[int, list[int]] = {}
        for i, chunk in enumerate(chunks):
            by_length.setdefault(chunk.num_steps, []).append(i)
        rollouts = [self._rollout([chunks[i] for i in group], [rewards[i] for i in group])
                    for group in by_length.values()]
        # feed-forward: minibatches of steps; LSTM: minibatches of whole chunks
        if self.net.lstm is None:
            rollouts = [_merge_steps(rollouts)]
        ref_log_std = self.net.actor_logstd.detach().clone() if self.net.continuous else None
        coefs = (clip_coef, self.kl_coef) if self._capture is None else self._capture.scalars(clip_coef, self.kl_coef)

        epochs = 0
        for epoch in range(cfg.update_epochs):
            # the stats are the last epoch's, read after it; target_kl reads every epoch's last step
            stats_wanted = cfg.target_kl is not None or epoch == cfg.update_epochs - 1
            epoch_info: list[dict[str, torch.Tensor]] = []
            for rollout in rollouts:
                batch = rollout.logp.shape[1]
                minibatches = min(cfg.num_minibatches, batch)
                order = (torch.randperm(batch, generator=self._generator).to(self.device) if minibatches > 1
                         else torch.arange(batch, device=self.device))  # one minibatch: no shuffle to make
                for idx in order.tensor_split(minibatches):
                    epoch_info.append(self._minibatch_step(rollout, idx, ref_log_std, coefs, stats_wanted))
            epochs += 1
            # one host read per epoch, only with target_kl
            if cfg.target_kl is not None and (last_kl := epoch_info[-1]["approx_kl"].item()) > cfg.target_kl:
                log.debug("update %d: early stop after %d epochs (approx_kl %.4f > %.4f)",
                          self.iteration, epochs, last_kl, cfg.target_kl)
                break

        stats = mean_loss_terms(epoch_info)
        returns = torch.cat([r.returns.reshape(-1) for r in rollouts])
        stats["explained_variance"] = explained_variance(torch.cat([r.values.reshape(-1) for r in rollouts]), returns)
        stats["return_mean"] = returns.mean().item()
        for key in rollouts[0].diagnostics:
            stats[key] = torch.cat([r.diagnostics[key].reshape(-1) for r in rollouts]).float().mean().item()
        if cfg.mode == "adapt":
            stats["kl_coef"] = self.kl_coef
            self.kl_coef = adapt_kl_coef(self.kl_coef, stats["kl"], cfg.kl_target, cfg.kl_tolerance,
                                         cfg.kl_coef_factor, (cfg.kl_coef_min, cfg.kl_coef_max))
        stats.update(learning_rate=learning_rate, clip_coef=clip_coef, epochs=float(epochs),
                     num_steps=float(sum(c.num_steps for c in chunks)))
        self._update_obs_normalizer(chunks)
        self.iteration += 1
        return stats

    def _update_obs_normalizer(self, chunks: list[Chunk]) -> None:
        """Add the chunks' ``obs[:T]`` to the z-filter (``obs[T]`` is the next chunk's ``obs[0]``)."""
        if self.net.obs_normalizer is not None:
            steps = [tree_map(lambda v, n=c.num_steps: v[:n], c.obs) for c in chunks]
            self.net.obs_normalizer.update(obs_to_tensor(tree_stack(np.concatenate, steps), self.device))

    def update_normalizer(self, chunks: list[Chunk]) -> None:
        """Add the chunks' observations to the z-filter and their rewards to the reward scaler
        without training, to warm the statistics up."""
        self._update_obs_normalizer(chunks)
        if self.reward_scaler is not None:
            self.reward_scaler.scale_chunks([c.rewards for c in chunks], [c.terminated | c.truncated for c in chunks],
                                            [(c.agent_id, c.env_index) for c in chunks])

    def skipped(self, steps: list[SkippedSteps]) -> None:
        """The reward scaler takes dropped chunks' rewards in, as those of the chunks it scales:
        each stream's running return goes on through them and restarts at the episodes they end."""
        if self.reward_scaler is not None:
            for s in steps:
                self.reward_scaler.update(torch.as_tensor(s.rewards), torch.as_tensor(s.ends),
                                          stream=(s.agent_id, s.env_index))

    def actor_params(self) -> ParamDict:
        """The whole actor-critic (agents report values too) with the z-filter statistics."""
        return module_params("", self.net)

    def state_dict(self) -> dict[str, Any]:
        return {
            "network": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler is not None else {},
            "kl_coef": self.kl_coef,
            "iteration": self.iteration,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])
        self.kl_coef = float(state["kl_coef"])
        self.iteration = int(state["iteration"])
        self._generator.set_state(state["generator"])
