"""``surreal-redis default-config ALGO``: the full default config of one algorithm (ppo, appo, ddpg,
sac, crossq, or a plug-in's) as commented YAML.

The comments come from the config dataclasses themselves (attribute docstrings, ``#`` comments on
or above a field), so they cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import cache
from typing import Any

import yaml

from surreal_redis.config import ExperimentConfig
from surreal_redis.configtools import from_dict, to_dict


@cache
def field_help(cls: type) -> dict[str, str]:
    """Field name -> one-paragraph help text, gathered from ``cls``'s source."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        node = ast.parse(source).body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            after = body[i + 1] if i + 1 < len(body) else None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                helps[name] = " ".join(after.value.value.split())
                continue
            trailing = lines[stmt.lineno - 1].split("#", 1)
            comments: list[str] = []
            row = stmt.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                comments.insert(0, lines[row].strip().lstrip("#").strip())
                row -= 1
            if len(trailing) == 2 and "=" in trailing[0]:
                comments.append(trailing[1].strip())
            if comments:
                helps[name] = " ".join(comments)
    return helps


def _class_help(cls: type) -> str | None:
    """The first paragraph of ``cls``'s own docstring (not the one dataclass makes up)."""
    doc = inspect.getdoc(cls)
    return " ".join(doc.split("\n\n")[0].split()) if doc and not doc.startswith(cls.__name__ + "(") else None


def _emit(cls: type, data: dict[str, Any], indent: int, out: list[str], hints: dict[str, Any] | None = None,
          keys: dict[str, str] | None = None) -> None:
    """Append the fields of ``cls`` found in ``data`` (``keys``: field -> YAML key) as YAML lines, each
    under its help; at the top level a blank line sets each apart and a section's help is its class's."""
    hints = hints or typing.get_type_hints(cls)
    pad = "  " * indent
    for f in dataclasses.fields(cls):
        key = (keys or {}).get(f.name, f.name)
        if key not in data:
            continue
        sub = hints[f.name]
        section = isinstance(sub, type) and dataclasses.is_dataclass(sub) and isinstance(data[key], dict)
        if indent == 0:
            out.append("")
        text = _class_help(sub) if section and indent == 0 else field_help(cls).get(f.name)
        out.extend(f"{pad}# {line}" for line in textwrap.wrap(text or "", 96 - len(pad)))
        if section:
            out.append(f"{pad}{key}:")
            _emit(sub, data[key], indent + 1, out)
        else:
            rendered = yaml.safe_dump({key: data[key]}, default_flow_style=True, sort_keys=False, width=1000).strip()
            out.append(f"{pad}{rendered[1:-1] if rendered.startswith('{') else rendered}")


def commented_default_config(algo: str, plugins: tuple[str, ...] = ()) -> str:
    """The default :class:`ExperimentConfig` for ``algo`` as YAML with comments: its own section
    under its name, and of the two regimes' sections only the one it reads (``off_policy`` or
    ``replay``). Raises ValueError naming an unknown algorithm."""
    config = from_dict(ExperimentConfig, {"plugins": list(plugins), "algo": algo})
    spec = config.algorithm
    data = to_dict(config)
    data.pop("replay" if not spec.on_policy else "off_policy")
    if not plugins:
        data.pop("plugins")
    out = [f"# surreal-redis default config for {algo} (surreal-redis default-config {algo}).",
           f"# {spec.summary}" if spec.summary else "#",
           "# Every key is optional; unknown keys are errors. Override any value with -o key.path=value."]
    hints = typing.get_type_hints(ExperimentConfig)
    hints["algo_config"] = spec.config_class
    _emit(ExperimentConfig, data, 0, out, hints, {"algo_config": spec.name})
    return "\n".join(out) + "\n"
