"""Typed, validated construction of frozen config dataclasses from plain dicts (YAML).

:func:`from_dict` builds a dataclass from a mapping, rejecting unknown keys and wrong types with
an error that names the dotted key; :func:`apply_overrides` applies ``a.b=c`` overrides. YAML is
read and written as YAML 1.2 floats (:class:`ConfigLoader`, :class:`ConfigDumper`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key is invalid; the message names the dotted key."""


# YAML 1.2 floats that YAML 1.1 (PyYAML) leaves as strings, such as 1e-3 and 1.0e3 (its floats need
# a dot and a signed exponent). Checked after PyYAML's own resolvers, so ints, YAML 1.1 floats and
# .inf/.nan keep their meaning.
_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?$")
_FLOAT_FIRST = list("-+0123456789.")


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-3``, ``1E9``, ``-.5`` and ``1.0e3`` as floats."""


class ConfigDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes strings :class:`ConfigLoader` would read as floats."""


for _yaml_class in (ConfigLoader, ConfigDumper):
    _yaml_class.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, _FLOAT_FIRST)


def parse_yaml(text: str) -> Any:
    """``text`` read as YAML with :class:`ConfigLoader`."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML that :func:`parse_yaml` reads back unchanged."""
    return yaml.dump(data, Dumper=ConfigDumper, **options)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` as type ``tp`` (a config field's annotation); ConfigError naming ``where`` if it
    cannot be one."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, where)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (tuple, list):
        return _coerce_sequence(value, tp, where)
    if origin in (dict, Mapping) or tp is dict:
        return _coerce_mapping(value, tp, where)
    return _coerce_scalar(value, tp, where)


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    """The first member of union ``tp`` that ``value`` can be (None only where ``tp`` allows it)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except ConfigError:
            continue
    raise ConfigError(f"{where}: {value!r} matches none of {_type_name(tp)}")


def _coerce_sequence(value: Any, tp: Any, where: str) -> list[Any] | tuple[Any, ...]:
    """A list, a variadic tuple, or a fixed tuple (one type per item) from any non-string iterable."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(f"{where}: expected a list, got {value!r}")
    items = list(value)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(items) != len(args):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(items)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(items, args)))
    item_type = args[0] if args else Any
    coerced = [_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(items)]
    return tuple(coerced) if origin is tuple else coerced


def _coerce_mapping(value: Any, tp: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    args = typing.get_args(tp)
    key_type, value_type = args if args else (Any, Any)
    return {_coerce(k, key_type, where): _coerce(v, value_type, f"{where}.{k}") for k, v in value.items()}


def _coerce_scalar(value: Any, tp: Any, where: str) -> Any:
    """bool, int (a whole float too), float (an int too), str, or an instance of class ``tp``.
    YAML's booleans are never numbers here."""
    if tp is bool or tp is str:
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {'true/false' if tp is bool else 'a string'}, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def from_dict(cls: type[T], data: Mapping[str, Any] | None, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; missing keys take the defaults.

    Raises :class:`ConfigError` naming the dotted key for unknown keys, wrong types and values
    rejected by the dataclass's own ``__post_init__`` checks. A class with a ``config_from_dict``
    classmethod (and ``config_to_dict`` for :func:`to_dict`) maps its YAML itself, ending in
    :func:`build_dataclass`.
    """
    hook = getattr(cls, "config_from_dict", None)
    if hook is not None:
        return hook(dict(data or {}), where)
    return build_dataclass(cls, data, where)


def build_dataclass(cls: type[T], data: Mapping[str, Any] | None, where: str = "") -> T:
    """:func:`from_dict` without the class's own hook: each key a field of ``cls``."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        name = f"{where}.{unknown[0]}" if where else unknown[0]
        close = difflib.get_close_matches(unknown[0], fields, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"unknown config key {name!r}{hint} (known keys{' of ' + where if where else ''}: "
            f"{', '.join(sorted(fields))})"
        )
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}" if where else name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from exc


def to_dict(obj: Any) -> Any:
    """Plain-data (YAML-safe) form of a config dataclass, recursively."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "config_to_dict"):
            return obj.config_to_dict()
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay as values)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a deep copy of ``data`` with each ``"a.b.c=value"`` applied (value parsed as YAML,
    by :func:`parse_yaml`)."""
    result = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        path, raw = item.split("=", 1)
        parts = path.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML: {exc}") from exc
        node = result
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_yaml(path: str) -> dict[str, Any]:
    """Read a YAML mapping from ``path``; errors name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = parse_yaml(fh.read())
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping at the top level")
    return data
