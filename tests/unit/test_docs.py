"""The README and the docs site (docs/, mkdocs.yml) hold together with the code.

- ``mkdocs build --strict`` passes: no broken link or anchor, no page left out of the nav (the
  ``dev`` extra installs mkdocs-material, so CI never skips this);
- the generated references list every config key and every command;
- every ``surreal-redis ...`` command a page shows parses through the click CLI, and the shipped
  config it names loads with its ``-o`` overrides;
- the README stays a front door (at most 200 lines) whose links all point at files that exist.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path
from typing import NamedTuple

import click
import pytest

from surreal_redis.cli import main
from surreal_redis.config import ExperimentConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
README_MAX_LINES = 200
QUICK_START = "scripts/setup-env embedded && .venv/bin/surreal-redis launch configs/ppo_cartpole.yaml"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key path of a config dataclass (``hub.sender.flush_steps``, ...)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if f.name == "algo_config":
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _config_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


# ---------------------------------------------------------------- the site

@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs-material is not installed (the docs and dev extras install it)")
def test_the_site_builds_with_strict_checks(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    config_page = (site / "configuration" / "index.html").read_text()
    assert "hub.sender.flush_steps" in config_page and "<!-- generated" not in config_page
    cli_page = (site / "cli" / "index.html").read_text()
    assert "Usage: surreal-redis launch [OPTIONS] CONFIG" in cli_page


def test_every_page_is_in_the_nav():
    """mkdocs --strict fails on an omitted page too; this says which, without mkdocs."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def named(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from named(value) if isinstance(value, list) else [value]

    listed = set(named(nav))
    assert {str(p.relative_to(DOCS)) for p in PAGES} <= listed


def test_the_config_reference_lists_every_key_of_every_section():
    from surreal_redis.algos.registry import algorithm, algorithm_names

    page = _hooks().config_reference()
    missing = [key for key in _config_keys(ExperimentConfig) if f"`{key}`" not in page]
    for name in algorithm_names():
        missing += [key for key in _config_keys(algorithm(name).config_class, f"{name}.") if f"`{key}`" not in page]
    assert missing == []
    assert "``" not in page and ":class:" not in page  # reST markup became markdown


def test_the_config_reference_keeps_table_cells_whole():
    hooks = _hooks()
    assert hooks.markdown_text("a | b, ``x | y`` and <root> *k*") == r"a \| b, `x | y` and &lt;root&gt; \*k\*"
    for line in hooks.config_reference().splitlines():
        if line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", re.sub(r"`[^`]*`", "code", line))
            assert len(cells) == 6, line  # key, type, default, meaning between the outer pipes


def test_the_cli_reference_shows_every_command():
    page = _hooks().cli_reference()
    for name, command in main.commands.items():
        assert f"Usage: surreal-redis {name}" in page
        for sub in getattr(command, "commands", {}):
            assert f"Usage: surreal-redis {name} {sub}" in page


# ---------------------------------------------------------------- the commands the pages show

class ShownCommand(NamedTuple):
    where: str
    line: str
    args: list[str]


_FENCE = re.compile(r"^\s*(```|~~~)")
_RUNS_SURREAL = re.compile(r"surreal-redis |surreal_redis\.cli |run --rm admin ")
_PLACEHOLDER = re.compile(r"(?<=\s)[A-Z][A-Z_]*(?=\s|$)")
_SEPARATORS = {"&&", "||", ";", "|", "&"}
_REDIRECTS = {">", ">>", "<", "2>", "2>>"}


def _candidate_lines(text: str) -> list[tuple[int, str]]:
    """Lines of code blocks (fenced or indented) and inline code spans that run surreal-redis;
    continuation lines (``\\``) joined. An inline span with a placeholder argument in capitals
    (``surreal-redis agent --id K``) is a synopsis in prose, not a command line: left out."""
    found: list[tuple[int, str]] = []
    lines = text.splitlines()
    in_fence = False
    pending = ""
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or line.startswith("    "):
            joined = pending + line.strip()
            if joined.endswith("\\"):
                pending = joined[:-1] + " "
                continue
            pending = ""
            if _RUNS_SURREAL.search(joined):
                found.append((number, joined))
        else:
            found += [(number, span) for span in re.findall(r"`([^`]*)`", line)
                      if _RUNS_SURREAL.search(span) and not _PLACEHOLDER.search(span)]
    return found


def _surreal_args(tokens: list[str]) -> list[str] | None:
    """The surreal-redis arguments of one simple shell command, or None if it runs something else."""
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    if not tokens:
        return None
    if Path(tokens[0]).name == "surreal-redis":
        return tokens[1:]
    if tokens[0] == "python" and tokens[1:3] == ["-m", "surreal_redis.cli"]:
        return tokens[3:]
    if tokens[:2] == ["docker", "compose"] and "run" in tokens:  # compose's admin service runs surreal-redis
        rest = tokens[tokens.index("run") + 1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        if rest and rest[0] == "admin":
            return rest[1:]
    return None


def shown_commands(paths: list[Path] | None = None) -> list[ShownCommand]:
    """Every surreal-redis command line the given pages (default: the README and the docs) show."""
    shown = []
    for path in paths or [ROOT / "README.md", *PAGES]:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for number, line in _candidate_lines(path.read_text()):
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            lexer.whitespace_split = True
            tokens = list(lexer)
            segments: list[list[str]] = [[]]
            skip_next = False
            for token in tokens:
                if skip_next:
                    skip_next = False
                elif token in _SEPARATORS:
                    segments.append([])
                elif token in _REDIRECTS:
                    skip_next = True  # the file name
                else:
                    segments[-1].append(token)
            for segment in segments:
                args = _surreal_args(segment)
                if args is not None:
                    shown.append(ShownCommand(f"{where}:{number}", line, args))
    return shown


def _resolve_shown_config(path: str) -> Path | None:
    """A config the pages name: a file of the repository or a shipped config's bare name. None for
    the user's own files (``my.yaml``, which ``default-config`` writes)."""
    if (ROOT / path).is_file():
        return ROOT / path
    if "/" not in path and "." not in path and (ROOT / "configs" / f"{path}.yaml").is_file():
        return ROOT / "configs" / f"{path}.yaml"
    if path.startswith("configs/") or ("/" not in path and "." not in path):
        raise AssertionError(f"{path!r} is not a file in the repository nor a shipped config")
    return None


def check_shown_command(command: ShownCommand) -> None:
    """Parse ``command`` through the CLI without running it; load the shipped config it names
    with its overrides. Raises AssertionError naming the page line."""
    args = list(command.args)
    if args[:1] == ["--log-level"]:
        args = args[2:]
    group: click.Group = main
    path = ["surreal-redis"]
    while True:
        assert args, f"{command.where}: {command.line!r} names no command"
        sub = group.commands.get(args[0])
        assert sub is not None, (f"{command.where}: {args[0]!r} is not a command of {' '.join(path)} "
                                 f"(have {', '.join(sorted(group.commands))})")
        path.append(args.pop(0))
        if not isinstance(sub, click.Group):
            break
        group = sub
    try:
        params = sub.make_context(" ".join(path), args).params
    except click.ClickException as exc:
        raise AssertionError(f"{command.where}: {command.line!r}: {exc.format_message()}") from None
    config_path = params.get("config_path")
    if config_path is None:
        return
    try:
        config_file = _resolve_shown_config(config_path)
    except AssertionError as exc:
        raise AssertionError(f"{command.where}: {command.line!r}: {exc}") from None
    if config_file is None:
        return
    overrides = list(params.get("overrides", ()))
    if params.get("agents") is not None:
        overrides.append(f"agent.num_agents={params['agents']}")
    try:
        load_config(config_file, overrides)
    except ValueError as exc:
        raise AssertionError(f"{command.where}: {command.line!r}: the config does not load: {exc}") from None


def test_the_pages_show_the_quick_start_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    assert QUICK_START in readme and "scripts/test" in readme
    shown = shown_commands()
    readme_commands = [c for c in shown if c.where.startswith("README.md")]
    assert any(c.args == ["launch", "configs/ppo_cartpole.yaml"] for c in readme_commands)
    assert len(shown) >= 20  # the pages show many; finding few means the extraction broke


def test_every_command_the_pages_show_parses_and_its_config_loads():
    problems = []
    for command in shown_commands():
        try:
            check_shown_command(command)
        except AssertionError as exc:
            problems.append(str(exc))
    assert problems == []


def shown_overrides(paths: list[Path] | None = None) -> list[tuple[str, str]]:
    """(where, KEY=VALUE) of every ``-o KEY=VALUE`` the pages show, in commands or in prose."""
    found = []
    for path in paths or [ROOT / "README.md", *PAGES]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [(f"{path.name}:{number}", m)
                      for m in re.findall(r"-o ([a-z_][\w.]*=(?:\$\([A-Z_]+\)|[^\s`)])*)", line)]
    return found


def test_every_override_the_pages_show_names_a_config_key():
    """Overrides in prose (``-o env.pixels.enabled=true``) too: applied to the default config of the
    algorithm their key names (PPO's otherwise). A variable (compose's ``$NAME``, Kubernetes'
    ``$(NAME)``) takes its value in compose/.env.example."""
    from surreal_redis.algos.registry import algorithm_names

    example = dict(line.split("=", 1) for line in (ROOT / "compose" / ".env.example").read_text().splitlines()
                   if re.match(r"[A-Z_]+=", line))
    shown = shown_overrides()
    assert len(shown) >= 5
    problems = []
    for where, override in shown:
        override = re.sub(r"\$[({]?([A-Z_]+)[)}]?", lambda m: example.get(m.group(1), f"<no {m.group(1)}>"),
                          override)
        section = override.split(".", 1)[0]
        algo = section if section in algorithm_names() else "ppo"
        try:
            load_config(None, [f"algo={algo}", override])
        except ValueError as exc:
            problems.append(f"{where}: -o {override}: {exc}")
    assert problems == []


def test_a_wrong_override_in_prose_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Try `-o env.pixel.enabled=true` for camera frames.\n")
    (where, override), = shown_overrides([page])
    with pytest.raises(ValueError, match="pixel"):
        load_config(None, ["algo=ppo", override])


@pytest.mark.parametrize("line, message", [
    ("surreal-redis launch configs/ppo_cartpole.yaml --agent 4", "No such option"),
    ("surreal-redis launch configs/ppo_cartpol.yaml", "not a file in the repository"),
    ("surreal-redis launch configs/ppo_cartpole.yaml -o ppo.learning_rat=1e-3", "learning_rat"),
    ("surreal-redis lunch configs/ppo_cartpole.yaml", "'lunch' is not a command"),
    ("surreal-redis bench hub", "'bench' is not a command of surreal-redis"),
    ("surreal-redis eval --mode random --run my-run", "random"),
])
def test_a_wrong_command_on_a_page_fails(tmp_path, line, message):
    page = tmp_path / "page.md"
    page.write_text(f"Try:\n\n```bash\n{line}   # a comment\n```\n")
    found = shown_commands([page])
    assert len(found) == 1
    with pytest.raises(AssertionError, match=message):
        check_shown_command(found[0])


def test_commands_are_found_in_every_form_a_page_writes_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "Inline `surreal-redis stop --run a`, not the synopsis `surreal-redis agent --id K`, and in a list:", "",
        "    SURREAL_REDIS_URL=redis://h:1/0 surreal-redis status --run b --watch", "",
        "```bash",
        "scripts/setup-env embedded && .venv/bin/surreal-redis launch configs/smoke.yaml \\",
        "    -o experiment.name=c",
        "surreal-redis default-config ddpg > my.yaml   # commented",
        "docker compose -f compose/docker-compose.yml run --rm admin gc --run d",
        "```", ""]))
    found = [c.args for c in shown_commands([page])]
    assert found == [["stop", "--run", "a"], ["status", "--run", "b", "--watch"],
                     ["launch", "configs/smoke.yaml", "-o", "experiment.name=c"],
                     ["default-config", "ddpg"], ["gc", "--run", "d"]]


# ---------------------------------------------------------------- the README

def test_the_readme_is_a_front_door_whose_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links, "the README points to the docs"
    for link in links:
        if re.match(r"[a-z]+://", link) or link.startswith("#"):
            continue
        target, _, anchor = link.partition("#")
        assert (ROOT / target).exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _heading_ids((ROOT / target).read_text()), f"README links to {link}: no such heading"


def _heading_ids(text: str) -> set[str]:
    """The anchors MkDocs' toc gives a page's headings (its default slugify)."""
    ids = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        words = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        ids.add(re.sub(r"[-\s]+", "-", words))
    return ids
