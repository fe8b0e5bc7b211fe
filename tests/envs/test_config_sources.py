"""Shipped configs that cite a source match it, or their comments say where they do not.

For each config that names the settings it follows, the tables below record the source's values,
keyed by the setting's path in our config (``ppo.clip_vloss``). Where our value differs, the
config's comments must name that key as it reads under its section (``clip_vloss``,
``noise.sigma``, ``robosuite.horizon``), so a difference nobody wrote down fails here. Source
settings with no counterpart in the project, or with another meaning here, are listed by the
source's own name, which the comments must also contain.

Covered: ppo_halfcheetah (rl-baselines3-zoo), ppo_robosuite_lift, ppo_dmc_cheetah,
ddpg_robosuite_lift and ddpg_dmc_cheetah (SURREAL). Loading a config builds no env.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from surreal_redis.config import load_config, resolve_config_path
from surreal_redis.configtools import to_dict


@dataclass(frozen=True)
class Source:
    cites: tuple[str, ...]
    """Text the config's comments must contain: the file (and entry) the settings come from."""
    settings: dict[str, Any]
    """Our key path -> the source's value."""
    unmatched: dict[str, str] = field(default_factory=dict)
    """The source's name for a setting the project lacks or means differently -> what it is;
    the comments must contain the name."""


# rl-baselines3-zoo hyperparams/ppo.yml, entry HalfCheetah-v4; what it leaves out takes SB3 PPO's
# and VecNormalize's defaults (stable_baselines3/ppo/ppo.py, common/vec_env/vec_normalize.py).
ZOO_PPO_HALFCHEETAH = Source(
    cites=("rl-baselines3-zoo", "hyperparams/ppo.yml", "HalfCheetah-v4"),
    settings={
        "env.env_id": "HalfCheetah-v4",
        "env.num_envs": 1,  # n_envs: 1
        "agent.num_agents": 1,  # one process, one env
        "ppo.mode": "clip",
        "ppo.learning_rate": 2.0633e-05,
        "ppo.anneal_lr": False,  # a constant, not lin_...
        "ppo.anneal_clip": False,  # clip_range: 0.1, a constant
        "learner.steps_per_update": 512,  # n_steps 512 x n_envs 1
        "ppo.update_epochs": 20,  # n_epochs
        "ppo.num_minibatches": 8,  # 512 / batch_size 64
        "ppo.gamma": 0.98,
        "ppo.gae_lambda": 0.92,
        "ppo.clip_coef": 0.1,  # clip_range
        "ppo.clip_vloss": False,  # SB3 clip_range_vf=None
        "ppo.ent_coef": 0.000401762,
        "ppo.vf_coef": 0.58096,
        "ppo.max_grad_norm": 0.8,
        "ppo.norm_adv": True,  # SB3 normalize_advantage=True
        "ppo.target_kl": None,  # SB3 target_kl=None
        "ppo.hidden_sizes": [256, 256],  # net_arch pi and vf
        "ppo.activation": "relu",  # activation_fn=nn.ReLU
        "ppo.init_log_std": -2.0,  # log_std_init=-2
        "ppo.use_lstm": False,
        "ppo.normalize_obs": True,  # normalize: true (VecNormalize)
        "ppo.normalize_reward": True,
        "ppo.obs_clip": 10.0,  # VecNormalize clip_obs
        "ppo.reward_clip": 10.0,  # VecNormalize clip_reward
        "stop.max_env_steps": 1_000_000,  # n_timesteps 1e6
    },
    unmatched={"ortho_init": "policy_kwargs ortho_init=False; the project always initializes orthogonally"},
)

# SurrealAI/surreal surreal/main/ppo_configs.py (PPO_DEFAULT_LEARNER_CONFIG, _ENV_CONFIG,
# _SESSION_CONFIG), as surreal/learner/ppo.py, agent/ppo_agent.py, model/ppo_net.py and
# model/model_builders/builders.py use them.
_SURREAL_PPO = {
    "ppo.mode": "adapt",  # ppo_mode
    "ppo.kl_target": 0.015,  # consts.kl_target
    "ppo.kl_coef_init": 1.0,  # adapt_consts.beta_init
    "ppo.kl_coef_min": 1 / 35,  # adapt_consts.beta_range
    "ppo.kl_coef_max": 35.0,
    "ppo.kl_tolerance": 2.0,  # consts.adjust_threshold (0.5, 2.0)
    "ppo.kl_coef_factor": 1.5,  # adapt_consts.scale_constant
    "ppo.target_kl": 4 * 0.015,  # learner/ppo.py: policy epochs break once kl > kl_target * 4
    "ppo.learning_rate": 1e-4,  # network.lr_actor, lr_critic
    "ppo.anneal_lr": True,  # network.anneal: LinearWithMinLR to min_lr 5e-5
    "ppo.gamma": 0.995,
    "ppo.gae_lambda": 0.97,  # advantage.lam
    "ppo.norm_adv": True,  # advantage.norm_adv
    "ppo.max_grad_norm": 5.0,  # actor_gradient_norm_clip, critic_gradient_norm_clip
    "ppo.update_epochs": 10,  # consts.epoch_policy, epoch_baseline
    "ppo.num_minibatches": 1,  # each batch of 64 windows is one gradient step per epoch
    "ppo.ent_coef": 0.0,  # the adapt loss has no entropy term
    "ppo.hidden_sizes": [300, 200],  # model.actor_fc_hidden_sizes, critic_fc_hidden_sizes
    "ppo.activation": "relu",  # builders.py PPO_ActorNetwork, PPO_CriticNetwork
    "ppo.use_lstm": True,  # rnn.if_rnn_policy
    "ppo.lstm_hidden": 100,  # rnn.rnn_hidden
    "ppo.init_log_std": -1.0,  # consts.init_log_sig
    "ppo.normalize_obs": True,  # use_z_filter
    "ppo.obs_clip": 5.0,  # model/z_filter.py clamps to +-5
    "ppo.normalize_reward": False,  # use_r_filter
    "hub.sender.flush_steps": 25,  # n_step: windows of 25 steps
    "learner.steps_per_update": 1600,  # replay.batch_size 64 windows x 25 steps
    "agent.fetch_every_steps": 100,  # fetch_parameter_interval
    "agent.num_agents": 16,  # README: 16 actors
    "eval.mode": "stochastic",  # stochastic_eval
    "env.action_repeat": 1,
    "env.frame_stack": 1,  # frame_stacks
    "env.pixels.enabled": False,  # pixel_input
    "env.max_episode_steps": 200,  # limit_episode_length
}
_SURREAL_PPO_UNMATCHED = {
    "kl_cutoff_coeff": "KL cutoff penalty 250 (KL - 2 kl_target)^2 once KL > 2 kl_target",
    "log_sig_range": "per-agent log-std jitter U(-0.25, 0.25)",
    "tanh": "tanh on the action mean (PPO_ActorNetwork)",
    "stride": "windows of 25 steps every 20 (overlapping)",
    "rnn.horizon": "GAE truncated at 5 steps inside each window",
    "exp_interval": "KL reference, beta and publish once per 4096 windows",
    "epoch_baseline": "separate value passes and optimizers",
}

SURREAL_PPO_ROBOSUITE = Source(
    cites=("SURREAL", "ppo_configs.py"),
    settings={**_SURREAL_PPO, "env.robosuite.reward_shaping": True},  # env/make_env.py make_robosuite
    unmatched=_SURREAL_PPO_UNMATCHED,
)
SURREAL_PPO_DMC = Source(
    cites=("SURREAL", "ppo_configs.py"),
    settings=_SURREAL_PPO,
    unmatched={**_SURREAL_PPO_UNMATCHED, "grayscale": "dm_control pixels turned to grayscale (make_dm_control)"},
)

# SurrealAI/surreal surreal/main/ddpg_configs.py: DDPG_DEFAULT_LEARNER_CONFIG, _ENV_CONFIG and
# _SESSION_CONFIG (what its DDPGLauncher runs), as surreal/learner/ddpg.py, agent/ddpg_agent.py and
# model/model_builders/builders.py use them.
_SURREAL_DDPG = {
    "ddpg.actor_hidden": [300, 200],  # model.actor_fc_hidden_sizes
    "ddpg.critic_hidden": [400, 300],  # model.critic_fc_hidden_sizes
    "ddpg.activation": "relu",  # builders.py ActorNetworkX, CriticNetworkX
    "ddpg.actor_lr": 1e-4,  # network.lr_actor
    "ddpg.critic_lr": 1e-3,  # network.lr_critic
    "ddpg.critic_l2": 0.0,  # network.critic_regularization (Adam weight_decay)
    "ddpg.gamma": 0.99,
    "ddpg.target_update": "hard",  # target_update.type
    "ddpg.hard_update_every": 500,  # target_update.interval
    "ddpg.policy_frequency": 1,  # learner/ddpg.py: an actor step in every _optimize
    "ddpg.actor_max_grad_norm": 1.0,  # actor_gradient_value_clip 1.0 (by value, see unmatched)
    "ddpg.critic_max_grad_norm": None,  # clip_critic_gradient False
    "ddpg.normalize_obs": False,  # DDPGModel has no z-filter
    "ddpg.noise.kind": "gaussian",  # exploration.noise_type normal
    "ddpg.noise.sigma": 1.0,  # exploration.max_sigma
    "ddpg.noise.agent_schedule": "linear",  # agent/ddpg_agent.py: max_sigma * agent_id / num_agents
    "ddpg.noise.param_noise": False,  # param_noise_type None
    "off_policy.batch_size": 512,
    "off_policy.n_step": 3,
    "off_policy.learning_starts": 9000,  # sampling_start_size 3000 per shard x replay_shards 3
    "off_policy.random_steps": 0,  # agent/ddpg_agent.py: the actor and its noise from the first step
    "off_policy.replay.capacity": 1_000_000,  # memory_size int(1e6 / 3) x 3 shards (999,999)
    "off_policy.replay.selector": "uniform",  # UniformReplay
    "hub.sender.flush_steps": 100,  # sender.flush_iteration
    "hub.publisher.min_publish_interval": 3.0,  # parameter_publish.min_publish_interval
    "agent.fetch_every_steps": 200,  # fetch_parameter_interval
    "agent.num_agents": 16,  # README: 16 actors
    "env.action_repeat": 1,
    "env.max_episode_steps": None,  # limit_episode_length 0
    "env.pixels.enabled": False,  # pixel_input
    "env.frame_stack": 3,  # frame_stacks (applied to pixels only)
}
_SURREAL_DDPG_UNMATCHED = {
    "actor_gradient_value_clip": "the actor gradient clipped by value, not norm",
    "max_sigma": "per-agent sigma max_sigma * agent_id / num_agents (agent 0: none)",
    "CriticNetworkX": "the action joins the critic after its first layer",
}

SURREAL_DDPG_DMC = Source(
    cites=("SURREAL", "ddpg_configs.py", "DDPG_DEFAULT"),
    settings=_SURREAL_DDPG,
    unmatched={**_SURREAL_DDPG_UNMATCHED, "grayscale": "dm_control pixels turned to grayscale (make_dm_control)"},
)
# ddpg_configs.py DDPG_BLOCK_LIFTING_LEARNER_CONFIG and _ENV_CONFIG, over the defaults above
SURREAL_DDPG_BLOCK_LIFTING = Source(
    cites=("SURREAL", "ddpg_configs.py", "DDPG_BLOCK_LIFTING"),
    settings={
        **_SURREAL_DDPG,
        "ddpg.critic_lr": 1e-4,
        "ddpg.critic_l2": 1e-4,  # critic_regularization
        "ddpg.noise.kind": "ou",  # noise_type ou_noise
        "ddpg.noise.sigma": 2.0,  # max_sigma
        "ddpg.noise.ou_theta": 0.15,  # theta
        "ddpg.noise.ou_dt": 1e-3,  # dt
        "env.action_repeat": 10,
        "env.max_episode_steps": 200,  # limit_episode_length, agent steps (robosuite's done ignored)
        "env.pixels.enabled": True,  # pixel_input
        "env.frame_stack": 3,
        "env.robosuite.reward_shaping": True,  # env/make_env.py make_robosuite
    },
    unmatched={**_SURREAL_DDPG_UNMATCHED, "actor_regularization": "Adam weight decay 1e-4 on the actor"},
)

SOURCES = {
    "ppo_halfcheetah": ZOO_PPO_HALFCHEETAH,
    "ppo_robosuite_lift": SURREAL_PPO_ROBOSUITE,
    "ppo_dmc_cheetah": SURREAL_PPO_DMC,
    "ddpg_robosuite_lift": SURREAL_DDPG_BLOCK_LIFTING,
    "ddpg_dmc_cheetah": SURREAL_DDPG_DMC,
}

_COMMENT = re.compile(r"(?:^|\s)#(.*)$")


def comments(name: str) -> str:
    """The comment text of a shipped config, header and end-of-line comments alike."""
    lines = resolve_config_path(name).read_text().splitlines()
    return "\n".join(m.group(1) for m in map(_COMMENT.search, lines) if m)


def value_at(tree: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        assert isinstance(tree, dict) and key in tree, f"{path}: no such setting in the config"
        tree = tree[key]
    return tree


def same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, float) and isinstance(ours, (int, float)) and not isinstance(ours, bool):
        return math.isclose(ours, theirs, rel_tol=1e-5)
    if isinstance(theirs, (list, tuple)) and isinstance(ours, (list, tuple)):
        return len(ours) == len(theirs) and all(map(same, ours, theirs))
    return type(ours) is type(theirs) and ours == theirs


def names(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


@pytest.mark.parametrize("name", SOURCES)
def test_config_names_its_source(name):
    text = comments(name)
    missing = [c for c in SOURCES[name].cites if c not in text]
    assert not missing, f"{name}.yaml does not cite {missing}"


@pytest.mark.parametrize("name", SOURCES)
def test_differences_from_the_source_are_documented(name):
    tree = to_dict(load_config(name))
    text = comments(name)
    undocumented = []
    for path, theirs in SOURCES[name].settings.items():
        ours = value_at(tree, path)
        key = path.split(".", 1)[1]
        if not same(ours, theirs) and not names(text, key):
            undocumented.append(f"{path}: ours {ours!r}, source {theirs!r}")
    assert not undocumented, (f"{name}.yaml differs from its source without naming the key in its "
                              "comments:\n" + "\n".join(undocumented))


@pytest.mark.parametrize("name", SOURCES)
def test_source_settings_without_a_counterpart_are_named(name):
    text = comments(name)
    unnamed = [f"{word} ({what})" for word, what in SOURCES[name].unmatched.items() if not names(text, word)]
    assert not unnamed, f"{name}.yaml does not say what it does about: " + "; ".join(unnamed)


def test_comparison_rules():
    assert same(0.0285714, 1 / 35) and not same(0.0286, 1 / 35)
    assert same(1_000_000, 1_000_000) and not same(True, 1) and not same(None, 0.0)
    assert same([300, 200], [300, 200]) and not same([300, 200], [400, 300])
    assert names(" clip_vloss: false", "clip_vloss") and not names("an_clip_vloss_x", "clip_vloss")
    # a key is named as it reads under its section, not as the tail of a longer name
    assert names("-o env.pixels.enabled=true", "pixels.enabled") and not names("ddpg.max_sigma", "sigma")
