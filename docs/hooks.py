"""MkDocs hook: pages generated from the code at every build, so they cannot go stale.

A page holds a marker line where the generated text goes:

- ``<!-- generated: config-reference -->``: every config key with its type, default and help, from
  the config dataclasses (the same source as ``surreal-redis default-config``:
  :func:`surreal_redis.config_doc.field_help`);
- ``<!-- generated: cli-reference -->``: the ``--help`` of every ``surreal-redis`` command, from
  the click CLI.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Any

import click
import yaml

MARKER = re.compile(r"^<!-- generated: (?P<name>[a-z-]+) -->$", flags=re.M)
# ``literal`` (reST) and :role:`target` become markdown code spans
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker with its generated text; an unknown marker fails the build."""
    def generate(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown generated section {name!r} "
                             f"(have {', '.join(sorted(GENERATORS))})")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


# ---------------------------------------------------------------- config reference

def markdown_text(text: str) -> str:
    """Help text from a docstring or comment as markdown safe inside a table cell."""
    text = _RST_ROLE.sub(lambda m: f"`{m.group(1)}`", _RST_LITERAL.sub(lambda m: f"`{m.group(1)}`", text))
    parts = _CODE_SPAN.split(text)
    # Outside code spans: no HTML, emphasis or cell breaks (inside one a table cell keeps | as text).
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", r"\*").replace("_", r"\_").replace("|", r"\|"))
    return "".join(parts)


def _default(value: Any) -> str:
    rendered = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    rendered = rendered.removesuffix("\n...").removesuffix("...").strip()
    return f"`{rendered}`"


def _type_name(f: dataclasses.Field) -> str:
    name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
    return f"`{name}`"


def _doc_paragraph(cls: type) -> str:
    """The first paragraph of a config class's own docstring (not dataclass's generated one)."""
    doc = inspect.getdoc(cls)
    if not doc or doc.startswith(cls.__name__ + "("):
        return ""
    return markdown_text(" ".join(doc.split("\n\n")[0].split()))


def _section(cls: type, data: dict[str, Any], path: str, level: int, out: list[str], lead: str = "") -> None:
    """A heading for ``path``, ``lead`` and its class's doc, a table of its plain keys, then its
    subsections."""
    from surreal_redis.config_doc import field_help

    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    out += ["", f"{'#' * level} `{path}`", ""]
    if lead:
        out += [lead, ""]
    doc = _doc_paragraph(cls)
    if doc:
        out += [doc, ""]
    nested = []
    rows = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(data[f.name], dict):
            nested.append((hints[f.name], data[f.name], f"{path}.{f.name}"))
        else:
            rows.append(f"| `{path}.{f.name}` | {_type_name(f)} | {_default(data[f.name])} | "
                        f"{markdown_text(helps.get(f.name, ''))} |")
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows]
    for sub, sub_data, sub_path in nested:
        _section(sub, sub_data, sub_path, min(level + 1, 4), out)


def config_reference() -> str:
    """Every section of :class:`ExperimentConfig`, then each built-in algorithm's own section."""
    from surreal_redis.algos.registry import algorithm, algorithm_names
    from surreal_redis.config import ExperimentConfig
    from surreal_redis.config_doc import field_help
    from surreal_redis.configtools import to_dict

    config = ExperimentConfig()
    data = to_dict(config)
    hints = typing.get_type_hints(ExperimentConfig)
    helps = field_help(ExperimentConfig)
    out = ["## Top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    sections = []
    for f in dataclasses.fields(ExperimentConfig):
        if f.name == "algo_config":
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            sections.append((hints[f.name], data[f.name], f.name))
        else:
            out.append(f"| `{f.name}` | {_type_name(f)} | {_default(data[f.name])} | "
                       f"{markdown_text(helps.get(f.name, ''))} |")
    for cls, section_data, name in sections:
        _section(cls, section_data, name, 2, out)
    out += ["", "## Algorithm sections", "",
            "The section named by `algo` (only that one may appear in a config)."]
    for name in algorithm_names():
        spec = algorithm(name)
        regime = "on-policy: reads `replay`" if spec.on_policy else "off-policy: reads `off_policy`"
        lead = f"{markdown_text(spec.summary)} ({regime})." if spec.summary else f"{regime.capitalize()}."
        _section(spec.config_class, to_dict(spec.config_class()), name, 3, out, lead)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- CLI reference

def cli_reference() -> str:
    """``surreal-redis COMMAND --help`` for every command, in the order the CLI defines them."""
    from surreal_redis.cli import main

    root = click.Context(main, info_name="surreal-redis", terminal_width=100, max_content_width=100)
    out: list[str] = []

    def emit(command: click.Command, parent: click.Context, level: int) -> None:
        ctx = click.Context(command, info_name=command.name, parent=parent, terminal_width=100,
                            max_content_width=100)
        out.extend(["", f"{'#' * level} `{ctx.command_path}`", "", "```text", command.get_help(ctx), "```"])
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                emit(sub, ctx, level + 1)

    out.extend(["```text", main.get_help(root), "```"])
    for command in main.commands.values():
        emit(command, root, 2)
    return "\n".join(out) + "\n"


GENERATORS = {"config-reference": config_reference, "cli-reference": cli_reference}
