"""Algorithms declare themselves once (algos/spec.py) and are found by name (algos/registry.py):
config loading, default-config, the chunk check, the agents' policy and the learner's parts all
go through the declaration, and nothing else in the package names an algorithm."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import gymnasium as gym
import pytest

from surreal_redis.algos import registry
from surreal_redis.algos.ppo.config import PPOConfig
from surreal_redis.algos.spec import AlgorithmSpec, ChunkNeeds
from surreal_redis.config import MOVED_KEYS, load_config
from surreal_redis.config_doc import commented_default_config
from surreal_redis.configtools import ConfigError, from_dict, to_dict
from surreal_redis.learner.chunk_check import ChunkCheck

PACKAGE = Path(registry.__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_the_built_in_algorithms_are_registered_with_their_sections():
    names = registry.algorithm_names()
    assert {"ppo", "ddpg", "sac", "appo", "crossq"} <= set(names)
    for name in ("ppo", "ddpg", "sac", "appo", "crossq"):
        spec = registry.algorithm(name)
        config = load_config(None, [f"algo={name}"])
        assert type(config.algo_config) is spec.config_class and config.algorithm is spec
        assert registry.spec_of(config.algo_config) is spec
    assert registry.algorithm("ppo").on_policy and not registry.algorithm("ddpg").on_policy


def test_an_unknown_algorithm_is_an_error_naming_it_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"algo: 'dqn' is not a registered algorithm \(known: .*ddpg.*ppo"):
        load_config(None, ["algo=dqn"])
    with pytest.raises(ConfigError, match="algo: expected a string, got 3"):
        load_config(None, ["algo=3"])


def test_a_section_is_read_by_its_own_algorithm_only():
    """The trap this replaces: any name other than ppo silently got DDPG's section."""
    config = load_config(None, ["algo=ddpg", "ddpg.actor_lr=0.01"])
    assert config.algo_config.actor_lr == 0.01
    with pytest.raises(ConfigError, match="config section 'ppo' is for algo ppo, but algo is ddpg"):
        load_config("ppo_cartpole", ["algo=ddpg"])
    assert load_config("ppo_cartpole", ["algo=ddpg", "ppo=null"]).algo == "ddpg"
    with pytest.raises(ConfigError, match="unknown config key 'ddpg.learning_rate'"):
        load_config(None, ["algo=ddpg", "ddpg.learning_rate=0.1"])
    with pytest.raises(ConfigError, match="unknown config key 'algo_config'"):
        from_dict(type(load_config()), {"algo_config": {}})


@pytest.mark.parametrize("old, new", sorted(MOVED_KEYS.items()))
def test_a_moved_key_names_its_new_place(old, new):
    value = "true" if old.endswith("use_per") else "{}" if old.startswith("replay.") else "3"
    with pytest.raises(ConfigError, match=f"config key '{re.escape(old)}' has moved to {re.escape(new)}"):
        load_config(None, ["algo=ddpg", f"{old}={value}"])


def test_the_config_round_trips_with_the_section_under_the_algorithms_name():
    config = load_config("ddpg_pendulum")
    data = to_dict(config)
    assert "ddpg" in data and "algo_config" not in data and "ppo" not in data
    assert data["off_policy"]["n_step"] == 3 and data["off_policy"]["replay"]["selector"] == "uniform"
    assert from_dict(type(config), data) == config
    assert config.with_overrides(["off_policy.replay.selector=prioritized"]).off_policy.replay.selector == "prioritized"


def test_default_config_prints_the_algorithms_own_section_and_its_regime():
    ppo, ddpg = commented_default_config("ppo"), commented_default_config("ddpg")
    assert "\nppo:\n" in ppo and "\nddpg:" not in ppo and "\noff_policy:" not in ppo and "\nreplay:\n" in ppo
    assert "\nddpg:\n" in ddpg and "\noff_policy:\n" in ddpg and "\nreplay:\n" not in ddpg
    assert "  policy_frequency: 2" in ddpg and "selector: uniform" in ddpg
    for text in (ppo, ddpg):
        assert from_dict(type(load_config()), __import__("yaml").safe_load(text)) is not None
    with pytest.raises(ValueError, match="'nope' is not a registered algorithm"):
        commented_default_config("nope")


def spec(**overrides) -> AlgorithmSpec:
    fields = dict(name="toy_unit", config_class=PPOConfig, on_policy=True, make_trainer=lambda *a: None,
                  make_policy=lambda *a: None)
    return AlgorithmSpec(**{**fields, **overrides})


@dataclasses.dataclass
class Mutable:
    gamma: float = 0.9


@dataclasses.dataclass(frozen=True)
class NoGamma:
    lr: float = 0.1


def test_a_declaration_is_checked_when_made():
    with pytest.raises(ValueError, match="algorithm name 'Bad-Name' must match"):
        spec(name="Bad-Name")
    with pytest.raises(ValueError, match="config_class must be a frozen dataclass"):
        spec(config_class=Mutable)
    with pytest.raises(ValueError, match="is off-policy: NoGamma needs a gamma field"):
        spec(config_class=NoGamma, on_policy=False)
    with pytest.raises(ValueError, match="make_policy must be callable"):
        spec(config_class=NoGamma, make_policy=3)


def test_registering_refuses_a_taken_name_or_a_taken_config_class():
    with pytest.raises(ValueError, match="algorithm 'ppo' is registered already"):
        registry.register(spec(name="ppo", config_class=NoGamma))
    with pytest.raises(ValueError, match="config class PPOConfig belongs to algorithm 'ppo' already"):
        registry.register(spec())
    ppo = registry.algorithm("ppo")
    assert registry.register(ppo) is ppo  # the same declaration again is a no-op
    with pytest.raises(TypeError, match="takes an AlgorithmSpec"):
        registry.register("ppo")  # type: ignore[arg-type]


def test_a_plugin_module_registers_an_algorithm_that_config_chunk_check_and_policy_use(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    config = load_config("smoke", ["plugins=[toy_pg]", "algo=toy_pg", "ppo=null", "toy_pg.learning_rate=0.5"])
    assert config.algo_config.learning_rate == 0.5 and config.lockstep
    check = ChunkCheck.for_experiment(config, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    assert check.extra_shapes == {} and check.initial_state is None
    assert registry.algorithm("toy_pg").chunk_needs(config.algo_config, gym.spaces.Discrete(2)) == ChunkNeeds()
    assert "\ntoy_pg:\n  learning_rate: 0.01" in commented_default_config("toy_pg", ("toy_pg",))
    with pytest.raises(ConfigError, match="plugins: plugin module 'no_such_plugin' failed to import: "
                                          "ModuleNotFoundError"):
        load_config(None, ["plugins=[no_such_plugin]"])


def test_nothing_outside_an_algorithms_folder_names_one():
    """The package's modules reach algorithms only through their declarations: no module outside
    every ``algos/<name>/`` folder of a registered algorithm names an algorithm's config class or
    compares ``algo`` with a name. Algorithm packages may build on each other (APPO's section
    subclasses PPOConfig, CrossQ's builds on SAC's)."""
    builtins = ("ppo", "ddpg", "sac", "appo", "crossq")
    assert set(builtins) <= set(registry.algorithm_names())
    class_names = {registry.algorithm(name).config_class.__name__ for name in builtins}
    folders = [PACKAGE / "algos" / name for name in registry.algorithm_names()]
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if re.search(r"algo\s*[!=]=\s*['\"]", text):
            offenders.append(f"{path.relative_to(PACKAGE)}: compares algo with a name")
        if any(folder in path.parents for folder in folders):
            continue
        for class_name in class_names:
            if re.search(rf"\b{class_name}\b", text):
                offenders.append(f"{path.relative_to(PACKAGE)}: names {class_name}")
    assert offenders == []
