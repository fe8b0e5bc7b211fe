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
import logging
from importlib.metadata import entry_points
from typing import Any

from surreal_redis.algos.spec import AlgorithmSpec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "surreal_redis.algorithms"
BUILTIN_MODULES = ("surreal_redis.algos.ppo", "surreal_redis.algos.ddpg", "surreal_redis.algos.sac",
                   "surreal_redis.algos.appo")

_specs: dict[str, AlgorithmSpec] = {}
_builtins_loaded = False
_entry_points_loaded = False


class UnknownAlgorithm(ValueError):
    """No registered algorithm has the name or config section asked for."""


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Make ``spec`` findable by its name; registering the same spec again is a no-op, another
    spec under a taken name (or another algorithm's config class) raises ValueError."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"register() takes an AlgorithmSpec, got {type(spec).__name__}")
    _load_builtins()
    return _add(spec)


def _add(spec: AlgorithmSpec) -> AlgorithmSpec:
    held = _specs.get(spec.name)
    if held is not None and held != spec:
        raise ValueError(f"algorithm {spec.name!r} is registered already (config {held.config_class.__name__})")
    for other in _specs.values():
        if other.name != spec.name and other.config_class is spec.config_class:
            raise ValueError(f"config class {spec.config_class.__name__} belongs to algorithm {other.name!r} already")
    _specs[spec.name] = spec
    return spec


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_MODULES:
        _add(importlib.import_module(module).SPEC)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = point.load()
        except Exception as exc:  # a broken third-party package must not hide the built-ins
            log.error("entry point %s = %s of group %s failed to load: %s", point.name, point.value,
                      ENTRY_POINT_GROUP, exc)
            continue
        if not isinstance(spec, AlgorithmSpec):
            log.error("entry point %s = %s is a %s, not an AlgorithmSpec: skipped", point.name, point.value,
                      type(spec).__name__)
            continue
        _add(spec)


def load_plugins(modules: tuple[str, ...] | list[str]) -> None:
    """Import each plug-in module (which registers its algorithms); an import failure raises
    ValueError naming the module."""
    _load_builtins()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ValueError(f"plugin module {module!r} failed to import: {type(exc).__name__}: {exc}") from exc


def algorithm(name: str) -> AlgorithmSpec:
    """The spec registered under ``name``; raises :class:`UnknownAlgorithm` naming the known ones."""
    _load_builtins()
    if name not in _specs:
        _load_entry_points()
    if name not in _specs:
        raise UnknownAlgorithm(f"{name!r} is not a registered algorithm (known: {', '.join(algorithm_names())}; "
                               "others come from the config's plugins or an installed package's "
                               f"{ENTRY_POINT_GROUP} entry point)")
    return _specs[name]


def algorithm_names() -> tuple[str, ...]:
    """Names of the algorithms registered so far, sorted (built-ins always included)."""
    _load_builtins()
    return tuple(sorted(_specs))


def spec_of(section: Any) -> AlgorithmSpec:
    """The spec whose config class ``section`` is an instance of."""
    _load_builtins()
    for spec in _specs.values():
        if type(section) is spec.config_class:
            return spec
    raise UnknownAlgorithm(f"no registered algorithm has the config section {type(section).__name__} "
                           f"(known: {', '.join(algorithm_names())})")
