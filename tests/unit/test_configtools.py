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
