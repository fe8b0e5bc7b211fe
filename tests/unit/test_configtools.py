from dataclasses import dataclass, field
from typing import Literal

import pytest

from surreal_redis.configtools import ConfigError, apply_overrides, flatten, from_dict, to_dict


@dataclass(frozen=True)
class Inner:
    lr: float = 3e-4
    sizes: tuple[int, ...] = (64, 64)
    mode: Literal["clip", "adapt"] = "clip"


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    steps: int = 10
    seed: int | None = None
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self):
        if self.steps <= 0:
            raise ValueError(f"steps must be > 0, got {self.steps}")


def test_round_trip_and_defaults():
    cfg = from_dict(Outer, {"inner": {"lr": 1, "sizes": [32]}})
    assert cfg.inner.lr == 1.0 and cfg.inner.sizes == (32,) and cfg.seed is None
    assert from_dict(Outer, to_dict(cfg)) == cfg
    assert flatten(to_dict(cfg))["inner.lr"] == 1.0


@pytest.mark.parametrize("data, match", [
    ({"inner": {"lrr": 1}}, "inner.lrr"),
    ({"steps": "ten"}, "steps"),
    ({"steps": True}, "steps"),
    ({"inner": {"mode": "kl"}}, "inner.mode"),
    ({"inner": 3}, "inner"),
    ({"steps": -1}, "steps must be > 0"),
])
def test_errors_name_the_key(data, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(Outer, data)


def test_overrides_parse_yaml_values():
    data = apply_overrides({"inner": {"lr": 1.0}}, ["inner.lr=0.5", "steps=20", "inner.sizes=[8, 8]"])
    cfg = from_dict(Outer, data)
    assert cfg.inner.lr == 0.5 and cfg.steps == 20 and cfg.inner.sizes == (8, 8)
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["novalue"])


@pytest.mark.parametrize("raw, value", [
    ("1e-3", 1e-3), ("1e9", 1e9), ("1E-3", 1e-3), (".5", 0.5), ("-.5", -0.5), ("1.0e3", 1000.0), ("+2e2", 200.0),
    ("0.001", 0.001), ("3", 3.0),
])
def test_a_float_override_reads_as_written(raw, value):
    cfg = from_dict(Outer, apply_overrides({}, [f"inner.lr={raw}"]))
    assert cfg.inner.lr == value and type(cfg.inner.lr) is float


def test_an_int_field_takes_a_number_with_an_exponent_only_when_it_is_integral():
    assert from_dict(Outer, apply_overrides({}, ["steps=1e6"])).steps == 1_000_000
    assert from_dict(Outer, apply_overrides({}, ["steps=1.5e3"])).steps == 1500
    with pytest.raises(ConfigError, match="steps: expected an integer, got 0.001"):
        from_dict(Outer, apply_overrides({}, ["steps=1e-3"]))


def test_booleans_strings_and_special_floats_keep_their_yaml_meaning():
    values = apply_overrides({}, ["a=true", "b=no", "c=e5", "d=.inf", "e=1_000", "f='1e-3'", "g=1e", "h=x1e3"])
    assert values == {"a": True, "b": False, "c": "e5", "d": float("inf"), "e": 1000, "f": "1e-3", "g": "1e",
                      "h": "x1e3"}


def test_a_config_file_reads_numbers_as_written(tmp_path):
    from surreal_redis.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  learning_rate: 1e-3\n  max_grad_norm: 5E-1\nstop:\n  max_env_steps: 2e5\n")
    config = load_config(path)
    assert config.algo_config.learning_rate == 1e-3 and config.algo_config.max_grad_norm == 0.5
    assert config.stop.max_env_steps == 200_000


def test_yaml_written_reads_back_unchanged_strings_that_look_like_numbers_included():
    from surreal_redis.config import load_config
    from surreal_redis.configtools import dump_yaml, parse_yaml

    data = {"name": "1e3", "other": ".5", "lr": 1e-5, "big": 1e9, "n": 3, "flag": True}
    assert parse_yaml(dump_yaml(data)) == data
    config = load_config(None, ["experiment.name=run1", "ppo.learning_rate=1e-5"])
    config = config.with_overrides(["experiment.name='1e3'"])
    assert config.experiment.name == "1e3"
    assert from_dict(type(config), parse_yaml(config.to_yaml())) == config


@pytest.mark.parametrize("algo", ["ppo", "ddpg", "sac", "crossq"])
def test_the_commented_default_config_round_trips(tmp_path, algo):
    from surreal_redis.config import load_config
    from surreal_redis.config_doc import commented_default_config

    path = tmp_path / f"{algo}.yaml"
    path.write_text(commented_default_config(algo, ()))
    assert load_config(path) == load_config(None, [f"algo={algo}"])


def test_an_unknown_key_suggests_the_closest_known_one():
    from surreal_redis.config import ExperimentConfig

    with pytest.raises(ConfigError, match=r"unknown config key 'inner.lrr': did you mean 'lr'\? \(known keys of inner:"):
        from_dict(Outer, {"inner": {"lrr": 1}})
    with pytest.raises(ConfigError, match=r"unknown config key 'ppo.learning_rat': did you mean 'learning_rate'\?"):
        from_dict(ExperimentConfig, {"ppo": {"learning_rat": 1e-3}})
    with pytest.raises(ConfigError) as error:
        from_dict(Outer, {"zzzz": 1})
    assert "did you mean" not in str(error.value)


def test_a_directory_is_no_config_file_and_does_not_hide_the_shipped_one(tmp_path, monkeypatch):
    from surreal_redis.config import load_config
    from surreal_redis.resources import resource_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").mkdir()  # e.g. an experiment folder named like the shipped config
    assert load_config("smoke", []) == load_config(str(resource_dir("configs") / "smoke.yaml"), [])
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigError, match=r"^config file 'mine' is a directory, not a YAML file"):
        load_config("mine", [])
    with pytest.raises(ConfigError, match=r"^config file 'nothing' does not exist"):
        load_config("nothing", [])
