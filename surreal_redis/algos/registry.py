"""Where algorithms are found by name: the built-in ones, those of installed packages, and
plug-in modules a config names.

- Built-ins: ``surreal_redis.algos.<name>`` packages, each with a module-level ``SPEC``.
- Installed packages: an entry point in the group ``surreal_redis.algorithms`` whose object is an
  :class:`~surreal_redis.algos.spec.AlgorithmSpec` (``[options.entry_points]
  surreal_redis.algorithms = toy = my_package.toy:SPEC``), loaded the first time an unknown name
  is looked up.
- Plug-in modules: the config's ``plugins: [my_package.toy]`` are imported before the config is
  parsed (by every process of the run: the config travels with it); the module calls
  :func:`register` at import.

Torch-free: a spec imports its torch modules only when it builds a trainer or a torch policy.
"""

from __future__ import annotations

import importlib
from typing import Any

from surreal_redis.algos.spec import AlgorithmSpec
from surreal_redis.plugins import Registry

ENTRY_POINT_GROUP = "surreal_redis.algorithms"
BUILTIN_MODULES = ("surreal_redis.algos.ppo", "surreal_redis.algos.ddpg", "surreal_redis.algos.sac",
                   "surreal_redis.algos.appo", "surreal_redis.algos.crossq")

def _builtins() -> list[tuple[str, AlgorithmSpec]]:
    specs = [importlib.import_module(module).SPEC for module in BUILTIN_MODULES]
    return [(spec.name, spec) for spec in specs]


def _one_config_class_each(spec: AlgorithmSpec, registered: tuple[AlgorithmSpec, ...]) -> None:
    for other in registered:
        if other.config_class is spec.config_class:
            raise ValueError(f"config class {spec.config_class.__name__} belongs to algorithm {other.name!r} already")


ALGORITHMS: Registry[AlgorithmSpec] = Registry(
    "algorithm", ENTRY_POINT_GROUP, _builtins, (lambda item: isinstance(item, AlgorithmSpec), "an AlgorithmSpec"),
    describe=lambda spec: f"config {spec.config_class.__name__}", named=lambda point, spec: spec.name,
    check=_one_config_class_each)


class UnknownAlgorithm(ValueError):
    """No registered algorithm has the name or config section asked for."""


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Make ``spec`` findable by its name; registering the same spec again is a no-op, another
    spec under a taken name (or another algorithm's config class) raises ValueError."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"register() takes an AlgorithmSpec, got {type(spec).__name__}")
    return ALGORITHMS.add(spec.name, spec)


def algorithm(name: str) -> AlgorithmSpec:
    """The spec registered under ``name``; raises :class:`UnknownAlgorithm` naming the known ones."""
    spec = ALGORITHMS.get(name)
    if spec is None:
        raise UnknownAlgorithm(f"{name!r} is not a registered algorithm (known: {', '.join(algorithm_names())}; "
                               "others come from the config's plugins or an installed package's "
                               f"{ENTRY_POINT_GROUP} entry point)")
    return spec


def algorithm_names() -> tuple[str, ...]:
    """Names of the algorithms registered so far, sorted (built-ins always included)."""
    return ALGORITHMS.names()


def spec_of(section: Any) -> AlgorithmSpec:
    """The spec whose config class ``section`` is an instance of."""
    for spec in ALGORITHMS.items():
        if type(section) is spec.config_class:
            return spec
    raise UnknownAlgorithm(f"no registered algorithm has the config section {type(section).__name__} "
                           f"(known: {', '.join(algorithm_names())})")
