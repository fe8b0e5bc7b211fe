"""APPO: V-trace against eq. (1) of Espeholt et al. 2018 written out plainly, what it shares with GAE
without lag, the update differing from PPO's only through its targets, the config and its
declaration."""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
import threading
from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from surreal_redis.algos import registry
from surreal_redis.algos.appo.config import APPOConfig
from surreal_redis.algos.appo.trainer import APPOTrainer, vtrace
from surreal_redis.algos.ppo.config import PPOConfig
from surreal_redis.algos.ppo.losses import compute_gae
from surreal_redis.algos.ppo.trainer import PPOPolicy, PPOTrainer
from surreal_redis.cli import main
from surreal_redis.config import load_config
from surreal_redis.configtools import ConfigError, from_dict
from surreal_redis.envs import EnvConfig, make_vector_env
from surreal_redis.replay.feeds import OnPolicyFeed
from surreal_redis.replay.fifo import FIFOReplayConfig
from surreal_redis.testing.local_loop import ChunkCollector

T, B = 7, 5


# ---------------------------------------------------------------- V-trace against the paper

def episode_data(seed: int) -> dict[str, np.ndarray]:
    """Random ``[T, B]`` data with terminations and truncations inside the chunks: V(x_t) for
    t = 0..T (V(x_T) the chunk-end bootstrap), V of each step's true final observation, and
    log pi/mu wide enough that both truncation levels clip."""
    rng = np.random.default_rng(seed)
    ends = rng.random((T, B))
    terminated, truncated = ends < 0.15, (ends >= 0.15) & (ends < 0.3)
    terminated[2, 0] = truncated[2, 1] = truncated[T - 1, 2] = terminated[0, 3] = True
    truncated[2, 0] = terminated[2, 1] = terminated[T - 1, 2] = truncated[0, 3] = False
    return dict(rewards=rng.normal(size=(T, B)), values=rng.normal(size=(T + 1, B)),
                final_values=rng.normal(size=(T, B)), terminated=terminated, truncated=truncated,
                log_rhos=rng.normal(scale=0.6, size=(T, B)))


def reference_vtrace(d: dict[str, np.ndarray], gamma: float, lam: float, rho_bar: float,
                     c_bar: float) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (1) summed term by term, per column, with python loops:
    v_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t V, where e is the
    first episode end at or after s (or T-1), delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    with V(x_{t+1}) = 0 after a termination and V(final obs) after a truncation; and section
    4.2's advantage rho_s (r_s + gamma v_{s+1} - V(x_s)), v_{s+1} the same bootstrap at s's end."""
    vs, pg = np.zeros((T, B)), np.zeros((T, B))
    for b in range(B):
        ratio = np.exp(d["log_rhos"][:, b])
        rho = np.minimum(rho_bar, ratio)
        c = lam * np.minimum(c_bar, ratio)

        following = np.zeros(T)  # V(x_{t+1}) as the TD error at t sees it
        for t in range(T):
            if d["terminated"][t, b]:
                following[t] = 0.0
            elif d["truncated"][t, b]:
                following[t] = d["final_values"][t, b]
            else:
                following[t] = d["values"][t + 1, b]
        delta = [rho[t] * (d["rewards"][t, b] + gamma * following[t] - d["values"][t, b]) for t in range(T)]
        for s in range(T):
            total, trace = 0.0, 1.0
            for t in range(s, T):
                total += gamma ** (t - s) * trace * delta[t]
                if d["terminated"][t, b] or d["truncated"][t, b]:
                    break
                trace *= c[t]
            vs[s, b] = d["values"][s, b] + total
        for s in range(T):
            ended = d["terminated"][s, b] or d["truncated"][s, b] or s == T - 1
            next_v = following[s] if ended else vs[s + 1, b]
            pg[s, b] = rho[s] * (d["rewards"][s, b] + gamma * next_v - d["values"][s, b])
    return vs, pg


def as_tensors(d: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The arguments of :func:`vtrace` / :func:`compute_gae`: ``next_values`` is V(final obs)
    where an episode ended (what the learner computes for terminations too), V(x_{t+1}) elsewhere."""
    done = d["terminated"] | d["truncated"]
    next_values = np.where(done, d["final_values"], d["values"][1:])
    floats = dict(rewards=d["rewards"], values=d["values"][:T], next_values=next_values)
    out = {k: torch.tensor(v, dtype=torch.float64) for k, v in floats.items()}
    out.update(terminated=torch.tensor(d["terminated"]), truncated=torch.tensor(d["truncated"]))
    return out


@pytest.mark.parametrize("gamma, lam, rho_bar, c_bar", [
    (0.99, 1.0, 1.0, 1.0),  # the paper's defaults
    (0.9, 0.8, 1.0, 1.0),
    (0.95, 0.9, 1.5, 0.7),
    (0.9, 1.0, 0.6, 2.0),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_eq_1_summed_term_by_term(gamma, lam, rho_bar, c_bar, seed):
    d = episode_data(seed)
    ratio = np.exp(d["log_rhos"])
    assert (ratio > rho_bar).any() and (ratio < rho_bar).any() and (ratio > c_bar).any()  # clipping active
    out = vtrace(**as_tensors(d), log_rhos=torch.tensor(d["log_rhos"]), gamma=gamma, lam=lam,
                 rho_bar=rho_bar, c_bar=c_bar)
    vs, pg = reference_vtrace(d, gamma, lam, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.rhos.numpy(), np.minimum(rho_bar, ratio))
    assert out.rho_clipped.tolist() == (ratio > rho_bar * (1 + 1e-4)).tolist()


def test_vtrace_bootstraps_each_kind_of_end_as_told():
    """One column by hand, gamma 0.5, no lag: a truncation bootstraps from V(final obs), a
    termination from 0, the chunk's end from V(obs[T]); the trace stops at each."""
    rewards, values = torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])
    next_values = torch.tensor([0.0, 4.0, 2.0, 6.0])  # V(x1), V(final) at t=1 and t=2, V(obs[T])
    terminated, truncated = torch.tensor([0, 0, 1, 0]).bool(), torch.tensor([0, 1, 0, 0]).bool()
    out = vtrace(rewards, values, next_values, terminated, truncated, torch.zeros(4), gamma=0.5)
    # v3 = 1 + .5*6 (chunk end); v2 = 1 (terminated: no bootstrap); v1 = 1 + .5*4 (truncated);
    # v0 = V(x0) + delta0 + .5 * (v1 - V(x1)) = 1 + (1 + 0 - 1) + .5*3; pg0 = 1 + .5*v1 - V(x0)
    torch.testing.assert_close(out.vs, torch.tensor([2.5, 3.0, 1.0, 4.0]))
    torch.testing.assert_close(out.pg_advantages, torch.tensor([1.5, 3.0, 1.0, 4.0]))


# ---------------------------------------------------------------- V-trace and GAE without lag

@pytest.mark.parametrize("lam", [0.0, 0.8, 0.95, 1.0])
def test_without_lag_the_value_targets_are_gaes_lambda_returns(lam):
    """pi = mu, rho_bar = c_bar = 1: rho_t = 1 and c_t = lambda, so v_s - V(x_s) follows GAE's
    recursion exactly: v_s is GAE(lambda)'s return for any lambda. The policy-gradient advantage
    r_s + gamma v_{s+1} - V(x_s) = delta_s + gamma (1 - done_s) A_{s+1} carries the next step's GAE
    advantage undiscounted by lambda: it equals GAE's advantage only at lambda = 1."""
    d = episode_data(3)
    args = as_tensors(d)
    out = vtrace(**args, log_rhos=torch.zeros(T, B, dtype=torch.float64), gamma=0.9, lam=lam)
    advantages, returns = compute_gae(**args, gamma=0.9, gae_lambda=lam)
    torch.testing.assert_close(out.vs, returns)
    not_done = 1.0 - (args["terminated"] | args["truncated"]).double()
    next_advantage = torch.cat([advantages[1:], torch.zeros(1, B, dtype=torch.float64)])
    deltas = advantages - 0.9 * lam * not_done * next_advantage
    torch.testing.assert_close(out.pg_advantages, deltas + 0.9 * not_done * next_advantage)
    if lam == 1.0:
        torch.testing.assert_close(out.pg_advantages, advantages)
    else:
        assert not torch.allclose(out.pg_advantages, advantages)
    assert not out.rho_clipped.any() and torch.equal(out.rhos, torch.ones(T, B, dtype=torch.float64))


@pytest.mark.parametrize("lam", [0.0, 0.92, 1.0])
def test_the_lambda_advantage_is_gaes_without_lag_and_v_trace_s_correction_with_it(lam):
    """appo.pg_advantage lambda: v_s - V(x_s); without lag GAE(lambda)'s advantage for any lambda
    (so APPO on grants trains as PPO), with lag eq. (1)'s rho- and c-weighted correction."""
    d = episode_data(4)
    args = as_tensors(d)
    algo = APPOTrainer.__new__(APPOTrainer)
    algo.config = APPOConfig(gamma=0.9, gae_lambda=lam, pg_advantage="lambda")
    zeros = torch.zeros(T, B, dtype=torch.float64)
    fresh = algo._targets(**args, behaviour_logp=zeros, target_logp=zeros)
    advantages, returns = compute_gae(**args, gamma=0.9, gae_lambda=lam)
    torch.testing.assert_close(fresh.advantages, advantages)
    torch.testing.assert_close(fresh.returns, returns)
    lagged_logp = torch.as_tensor(np.random.default_rng(5).normal(0, 0.5, (T, B)))
    lagged = algo._targets(**args, behaviour_logp=zeros, target_logp=lagged_logp)
    out = vtrace(**args, log_rhos=lagged_logp, gamma=0.9, lam=lam)
    torch.testing.assert_close(lagged.advantages, out.vs - args["values"])
    assert not torch.allclose(lagged.advantages, advantages)


# ---------------------------------------------------------------- the update

SMALL = dict(hidden_sizes=(16, 16), device="cpu", update_epochs=2, num_minibatches=2)


def cartpole(config: PPOConfig, cls: type[PPOTrainer], seed: int = 0):
    envs = make_vector_env(EnvConfig(env_id="CartPole-v1", max_episode_steps=30), 3, seed=0)
    torch.manual_seed(seed)
    algo = cls(config, envs.single_observation_space, envs.single_action_space, seed=seed)
    policy = PPOPolicy(config, envs.single_observation_space, envs.single_action_space, 3, seed=seed)
    policy.load_params(algo.actor_params(), 0)
    return algo, policy, ChunkCollector(envs, policy, seed=seed)


def parameters(algo: PPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in algo.net.parameters()]


def test_an_update_on_lagged_chunks_reports_the_clipping():
    algo, policy, collector = cartpole(APPOConfig(learning_rate=0.02, **SMALL), APPOTrainer)
    lagged = collector.collect(48)  # by version 0
    assert any(c.truncated.any() for c in lagged) and any(c.terminated.any() for c in lagged)
    for _ in range(3):
        algo.update(collector.collect(48))  # the learner moves on: lagged is 3 versions old
    stats = algo.update(lagged)
    assert 0.0 < stats["rho_clipped_fraction"] <= 1.0 and 0.0 < stats["rho_mean"] < 1.0
    assert all(math.isfinite(v) for v in stats.values())
    policy.load_params(algo.actor_params(), algo.iteration)
    fresh = algo.update(collector.collect(48))  # the agents' current version: nothing to correct
    assert fresh["rho_clipped_fraction"] == 0.0 and fresh["rho_mean"] == pytest.approx(1.0, abs=1e-5)


def test_the_update_differs_from_ppos_only_through_the_targets(monkeypatch):
    """On lagged chunks APPO with PPO's ``_targets`` is PPO exactly; on fresh chunks (ratios 1) at
    lambda = 1 V-trace's targets are GAE's, and one update of each ends at the same parameters."""
    config = dict(gae_lambda=1.0, **SMALL)
    ppo, _, collector = cartpole(PPOConfig(**config), PPOTrainer)
    appo, _, _ = cartpole(APPOConfig(**config), APPOTrainer)
    torch.testing.assert_close(parameters(ppo), parameters(appo), rtol=0, atol=0)
    fresh = collector.collect(48)
    ppo_stats, appo_stats = ppo.update(fresh), appo.update(fresh)
    torch.testing.assert_close(parameters(ppo), parameters(appo), rtol=1e-5, atol=1e-6)
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "return_mean"):
        assert appo_stats[key] == pytest.approx(ppo_stats[key], rel=1e-4, abs=1e-6), key
    assert appo_stats["rho_clipped_fraction"] == 0.0

    lagged = collector.collect(48)  # by the initial parameters: both learners are one update ahead
    ppo_again, _, _ = cartpole(PPOConfig(**config), PPOTrainer, seed=1)
    appo_again, _, _ = cartpole(APPOConfig(**config), APPOTrainer, seed=1)
    ppo_again.load_state_dict(copy.deepcopy(ppo.state_dict()))  # Adam's loaded state is not copied
    appo_again.load_state_dict(copy.deepcopy(ppo.state_dict()))
    monkeypatch.setattr(APPOTrainer, "_targets", PPOTrainer._targets)
    assert ppo_again.update(lagged) == appo_again.update(lagged)
    torch.testing.assert_close(parameters(ppo_again), parameters(appo_again), rtol=0, atol=0)
    monkeypatch.undo()
    appo.update(lagged)
    assert not all(torch.equal(a, b) for a, b in zip(parameters(appo), parameters(appo_again)))


def test_clip_against_proximal_clips_around_the_learners_policy_not_the_agents():
    """On chunks 3 versions old, APPO's first gradient step with ``clip_against: proximal`` sees
    ratios pi/pi_prox of exactly 1 (no sample clipped, approx KL 0): the lag is in the
    advantages' rho; PPO's ratios pi/mu on the same chunks are not 1."""
    config = dict(SMALL, update_epochs=1, num_minibatches=1, learning_rate=0.02)
    appo, policy, collector = cartpole(APPOConfig(clip_against="proximal", **config), APPOTrainer)
    ppo, _, _ = cartpole(PPOConfig(**config), PPOTrainer)
    lagged = collector.collect(48)
    for _ in range(3):
        fresh = collector.collect(48)
        appo.update(fresh)
        ppo.update(fresh)
    appo_stats, ppo_stats = appo.update(lagged), ppo.update(lagged)
    assert appo_stats["approx_kl"] == pytest.approx(0.0, abs=1e-6) and appo_stats["clip_fraction"] == 0.0
    assert ppo_stats["approx_kl"] > 1e-4 and appo_stats["rho_mean"] < 1.0


class PassCounter:
    """Wraps a trainer's ``_minibatch_step``: per update, how many gradient passes each of its
    samples (the index of a step in the update's batch) took part in."""

    def __init__(self, trainer: PPOTrainer) -> None:
        self.trainer, self.step = trainer, trainer._minibatch_step
        self.passes: list[Counter[int]] = []
        trainer._minibatch_step = self._counted  # type: ignore[method-assign]

    def _counted(self, rollout, idx, *rest):
        if len(self.passes) < self.trainer.iteration + 1:
            self.passes.append(Counter())
        self.passes[-1].update(idx.tolist())
        return self.step(rollout, idx, *rest)


@pytest.mark.parametrize("arrival", ["slow", "fast"])
def test_each_sample_takes_the_configs_passes_however_fast_the_agents(arrival):
    """With the shipped APPO config (appo_cartpole.yaml, smaller network), every sample of every
    update takes part in exactly ``update_epochs`` gradient passes, whether each batch arrives
    after the previous update ended (slow agents) or the next batches are in the feed already
    (fast agents: until 2026-12-05 those updates stopped after min_epochs 1); and the feed
    trains as soon as it holds one batch, waiting for no data it does not use."""
    shipped = load_config("appo_cartpole").algo_config
    config = dataclasses.replace(shipped, hidden_sizes=(16, 16), device="cpu", num_minibatches=4)
    algo, _, collector = cartpole(config, APPOTrainer)
    counter = PassCounter(algo)
    feed = OnPolicyFeed(FIFOReplayConfig(max_policy_lag=None), steps_per_update=3 * 16)
    batches = [collector.collect(16) for _ in range(3)]  # 3 envs x 16 steps: one update each
    stop = threading.Event()
    if arrival == "slow":
        for batch in batches:
            for chunk in batch:
                feed.ingest(chunk)
            assert len(list(feed.train(algo, stop))) == 1  # one batch held: it trains at once
    else:
        for chunk in [c for batch in batches for c in batch]:
            feed.ingest(chunk)
        assert len(list(feed.train(algo, stop))) == 3
    assert algo.iteration == 3 and len(counter.passes) == 3
    for passes in counter.passes:
        assert sorted(passes) == list(range(48))  # every sample of the batch
        assert set(passes.values()) == {shipped.update_epochs}


# ---------------------------------------------------------------- config and declaration

@pytest.mark.parametrize("kwargs, match", [
    (dict(vtrace_rho_bar=0.0), "vtrace_rho_bar must be > 0, got 0.0"),
    (dict(vtrace_c_bar=-1.0), "vtrace_c_bar must be > 0, got -1.0"),
    (dict(vtrace_c_bar=float("nan")), "vtrace_c_bar must be > 0"),
    (dict(vtrace_c_bar=2.0), r"vtrace_c_bar must be <= vtrace_rho_bar, got 2.0 > 1.0"),
    (dict(gae_lambda=1.5), "gae_lambda"),  # PPO's checks still run
    (dict(clip_against="mu"), "clip_against must be 'behaviour' or 'proximal', got 'mu'"),
    (dict(pg_advantage="gae"), "pg_advantage must be 'one_step' or 'lambda', got 'gae'"),
])
def test_config_validation_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        APPOConfig(**kwargs)
    key, value = next(iter(kwargs.items()))
    with pytest.raises(ConfigError, match=f"appo.*{key}"):
        load_config(None, ["algo=appo", f"appo.{key}={value}"])


def test_algo_appo_loads_its_section_and_default_config_prints_it():
    config = load_config(None, ["algo=appo", "appo.vtrace_rho_bar=2.0"])
    assert type(config.algo_config) is APPOConfig and config.algo_config.vtrace_rho_bar == 2.0
    spec = registry.algorithm("appo")
    assert config.algorithm is spec and spec.on_policy and spec.config_class is APPOConfig
    assert registry.spec_of(config.algo_config) is spec and registry.spec_of(PPOConfig()).name == "ppo"
    ppo = registry.algorithm("ppo")
    assert (spec.make_policy, spec.chunk_needs, spec.numpy_unsupported) == \
        (ppo.make_policy, ppo.chunk_needs, ppo.numpy_unsupported)
    assert "V-trace" in spec.summary
    result = CliRunner().invoke(main, ["default-config", "appo"])
    assert result.exit_code == 0, result.output
    assert "\nappo:\n" in result.output and "\nppo:\n" not in result.output
    assert "  vtrace_rho_bar: 1.0" in result.output and "  vtrace_c_bar: 1.0" in result.output
    assert "# rho_bar: truncates the importance weight" in result.output
    assert type(from_dict(type(config), yaml.safe_load(result.output)).algo_config) is APPOConfig


def test_the_section_and_the_declaration_load_without_torch():
    code = ("import sys; from surreal_redis.config import load_config; "
            "c = load_config('appo_cartpole'); print(type(c.algo_config).__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["APPOConfig", "False"]


def test_the_shipped_configs_are_ppos_with_their_production_mode():
    """configs/appo_*.yaml keep their PPO counterpart's network and PPO settings (but those their
    comment says why they change). CartPole and HalfCheetah produce on grants one batch ahead
    (their comments say why), so steps lag one version (two for a flush that straddles an update,
    kept for V-trace by replay.fifo.max_policy_lag 2); Pong produces
    freely and bounds both the staleness the learner accepts and the backlog agents may build."""
    # CartPole: a 300k-step anneal (the longer budget leaves room; the run stops at its end)
    changed = {"cartpole": {"total_updates"}}
    for task in ("cartpole", "halfcheetah", "pong"):
        appo, ppo = load_config(f"appo_{task}"), load_config(f"ppo_{task}")
        assert appo.algo == "appo"
        shared = {f.name for f in dataclasses.fields(PPOConfig)} - changed.get(task, set())
        assert {k: getattr(appo.algo_config, k) for k in shared} == {k: getattr(ppo.algo_config, k) for k in shared}
        assert appo.learner.steps_per_update == ppo.learner.steps_per_update
        assert appo.algo_config.clip_against == ("proximal" if task == "halfcheetah" else "behaviour")
        assert appo.stale_round_advice is None  # one flush of every agent is well within max_policy_lag
        if task != "pong":
            assert appo.learner.on_policy_sync == "overlap" and appo.lockstep and appo.agent.nice == 0
            assert appo.replay.fifo.max_policy_lag == 2
            assert (appo.agent.num_agents, appo.env.num_envs) == (ppo.agent.num_agents, ppo.env.num_envs)
            continue
        assert appo.learner.on_policy_sync == "free"
        assert appo.replay.fifo.max_policy_lag is not None and 1 <= appo.replay.fifo.max_policy_lag <= 8
        assert appo.hub.sender.max_lag is not None and appo.hub.sender.max_lag >= 1
        assert appo.agent.nice > 0


def test_a_config_with_the_removed_min_epochs_fails_naming_it(tmp_path):
    """Configs from before 2026-12-05 load with a one-line error naming the removed key."""
    with pytest.raises(ConfigError, match=r"config key 'appo.min_epochs' was removed on 2026-12-05: every update "
                                          r"runs all update_epochs epochs.*delete the key$"):
        load_config(None, ["algo=appo", "appo.min_epochs=1"])
    old = tmp_path / "old.yaml"
    old.write_text("algo: appo\nappo:\n  min_epochs: null\n")
    with pytest.raises(ConfigError, match="'appo.min_epochs' was removed"):
        load_config(str(old))


def test_agents_whose_flushes_together_outlast_max_policy_lag_are_warned_about():
    """15 CartPole agents of 4 envs x 32 steps send 7.5 updates of 256 steps in one flush each: more
    than half of max_policy_lag 8, so the learner warns; with 2048 steps per update it is 0.94."""
    crowded = load_config("appo_cartpole", ["agent.num_agents=15", "env.num_envs=4", "learner.on_policy_sync=free",
                                            "replay.fifo.max_policy_lag=8"])
    assert crowded.stale_round_advice is not None
    assert "1920 env steps (15 agents x 4 envs x 32 steps), 7.5 updates" in crowded.stale_round_advice
    assert "replay.fifo.max_policy_lag 8" in crowded.stale_round_advice
    bigger = crowded.with_overrides(["learner.steps_per_update=2048", "learner.prefetch_chunks=64"])
    assert bigger.stale_round_advice is None
    on_grants = load_config("ppo_cartpole", ["agent.num_agents=15", "learner.on_policy_sync=lockstep"])
    assert on_grants.stale_round_advice is None  # grants bound what is produced


def test_float16_parameters_are_no_lag_to_the_clipped_share():
    """hub.publisher.dtype float16: agents act with rounded parameters; on data without lag the
    share of ratios clipped at rho-bar is 0, not the rounding's (about half of them)."""
    from surreal_redis.algos.ppo.numpy_policy import NumpyPPOPolicy
    from surreal_redis.hub.params.wire import from_wire, param_spec, to_wire

    envs = make_vector_env(EnvConfig(env_id="Pendulum-v1"), 3, seed=0)
    spaces = envs.single_observation_space, envs.single_action_space
    config = APPOConfig(hidden_sizes=(32, 32), device="cpu", update_epochs=1, num_minibatches=1)
    torch.manual_seed(0)
    trained = APPOTrainer(config, *spaces)
    with torch.no_grad():  # weights as large as a trained network's: the rounding shows in pi/mu
        for p in trained.net.parameters():
            p.normal_(0.0, 0.5)
        trained.net.actor_logstd.fill_(-2.0)
    params = trained.actor_params()
    policy = NumpyPPOPolicy(config, *spaces, num_envs=3, seed=0)
    policy.load_params(from_wire(to_wire(params, "float16"), param_spec(params)), 0)  # as agents load them
    chunks = ChunkCollector(envs, policy, seed=0).collect(64)

    def clipped_share(wire_dtype: str) -> float:
        algo = APPOTrainer(config, *spaces)
        algo.load_state_dict(copy.deepcopy(trained.state_dict()))
        algo.wire_dtype = wire_dtype
        return algo.update(chunks)["rho_clipped_fraction"]

    assert clipped_share("float16") == 0.0
    assert clipped_share("float32") > 0.2  # a learner unaware of the rounding counts it as clipping


def test_as_received_rounds_as_the_parameter_wire():
    from surreal_redis.algos.appo.trainer import as_received
    from surreal_redis.hub.params.wire import from_wire, param_spec, to_wire

    params = {"w": np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32),
              "big": np.array([1.0, 1e6], np.float32), "steps": np.array([3], np.int64)}
    wire = from_wire(to_wire(params, "float16"), param_spec(params))
    for name, value in params.items():
        received = as_received(torch.as_tensor(value), "float16").numpy()
        assert received.dtype == value.dtype and np.array_equal(received, wire[name]), name
    assert np.array_equal(as_received(torch.as_tensor(params["w"]), "float32").numpy(), params["w"])


def test_the_learner_tells_its_trainer_the_parameters_wire_dtype():
    from surreal_redis.learner.parts import LearnerParts

    config = load_config("appo_cartpole", ["hub.publisher.dtype=float16", "appo.device=cpu"])
    assert LearnerParts.of(config).algo.wire_dtype == "float16"
