"""Check the compose files offline, without Docker: what ``docker compose config`` would reject and
what only fails once containers run.

- each file, before and after interpolation, against the compose-spec JSON schema
  (``check-jsonschema --builtin-schema vendor.compose-spec``; skipped with a note when not installed);
- every learner/agent/eval/admin command is a ``surreal-redis`` command line the CLI accepts (after
  entrypoint.py's ``--id auto`` / ``--resume auto``), its ``--config`` exists in the mounted
  folder and loads with its ``-o`` overrides, all processes of a file run one experiment, and
  each connects as its run's ACL user with that user's password (``admin``: the administrator);
- the MLflow server's options are ones the installed MLflow accepts;
- the ``acl`` service's passwords are usable (length, URL-safe characters) and its run name is valid;
- every ``depends_on`` names a service, ``service_healthy`` ones have a healthcheck with
  ``start_interval``, every named volume is declared and every bind-mounted file exists.

    python compose/validate.py [--env-file compose/.env]   # exit 1 and one line per problem

Run it with the project's Python environment (it imports surreal_redis). The env file defaults
to compose/.env.example with test passwords filled in.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click
import yaml

from surreal_redis.acl import ROLES, username

sys.path.insert(0, str(Path(__file__).resolve().parent))  # entrypoint, acl_file beside this file
from acl_file import ADMIN_VARIABLE, acl_file_text, password_variable  # noqa: E402
from entrypoint import EntrypointError, command_index, complete  # noqa: E402

COMPOSE_DIR = Path(__file__).resolve().parent
COMPOSE_FILES = ("docker-compose.yml", "agents.yml", "gpu.yml", "cluster.yml")
IMAGE = "surreal-redis:"
# the overlay's services extend the hub file's
OVERLAYS = {"gpu.yml": "docker-compose.yml"}
EXAMPLE_PASSWORDS = {variable: f"example-{variable.lower().replace('_', '-')}-0"
                     for variable in (ADMIN_VARIABLE, *(password_variable(role) for role in ROLES))}
_VARIABLE = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                       r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


class InterpolationError(ValueError):
    """A ``${NAME:?message}`` whose variable is not set (the message is compose's)."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` with compose's variable syntax replaced in every string: ``$NAME``, ``${NAME}``,
    ``${NAME:-default}``, ``${NAME-default}``, ``${NAME:?error}``, ``${NAME?error}``, ``$$``."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op") or "", match.group("arg") or ""
        current = env.get(name)
        missing = current is None or (op.startswith(":") and current == "")
        if op.endswith("-"):
            return arg if missing else current
        if op.endswith("?") and missing:
            raise InterpolationError(f"{name}: {arg}")
        return current or ""

    return _VARIABLE.sub(replace, value)


def variables(text: str) -> set[str]:
    """The names of the variables a compose file uses."""
    return {m.group("braced") or m.group("bare") for m in _VARIABLE.finditer(text) if m.group(0) != "$$"}


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of a compose .env file (comments and blank lines skipped; no quoting)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def example_env() -> dict[str, str]:
    """compose/.env.example with example passwords and a hub address filled in."""
    env = {k: v for k, v in read_env_file(COMPOSE_DIR / ".env.example").items() if v}
    return {**EXAMPLE_PASSWORDS, "HUB_HOST": "hub.example.org", "AGENT_ID_BASE": "1000",
            "CLUSTER_ANNOUNCE_IP": "192.0.2.10", **env}


def load(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """A compose file, YAML merge keys resolved and variables interpolated."""
    return interpolate(yaml.safe_load(path.read_text()), env)


# ---------------------------------------------------------------- the processes' command lines

def _environment(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    return {str(k): str(v) for k, v in environment.items()}


def _config_on_host(path: str, service: Mapping[str, Any], compose_dir: Path) -> Path | None:
    """The host file behind a container path, through the service's bind mounts."""
    for volume in service.get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        target = rest.split(":", 1)[0]
        if source.startswith((".", "/")) and (path == target or path.startswith(target.rstrip("/") + "/")):
            return (compose_dir / source / path[len(target):].lstrip("/")).resolve()
    return None


def parse_command(where: str, args: list[str], at: int) -> tuple[str, dict[str, Any] | None]:
    """The parameters the CLI parses from the surreal-redis command line ``args[at:]`` (``("",
    params)``), or the one-line problem naming ``where`` (``(problem, None)``). Also used by
    deploy/kubernetes/validate.py."""
    from surreal_redis.cli import main as cli

    subcommand = cli.commands.get(args[at])
    if subcommand is None:
        return f"{where}: {args[at]!r} is not a surreal-redis command (have {', '.join(sorted(cli.commands))})", None
    try:
        return "", subcommand.make_context(args[at], args[at + 1:]).params
    except click.ClickException as exc:
        return f"{where}: surreal-redis {' '.join(args[at:])}: {exc.format_message()}", None


def command_problems(name: str, service: Mapping[str, Any], env: Mapping[str, str],
                     compose_dir: Path) -> tuple[list[str], tuple | None]:
    """Problems of one surreal-redis service's command line, and the experiment it runs
    (config file, overrides) for the cross-service check."""
    from surreal_redis.config import load_config

    command = service.get("command")
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        return [f"{name}: command must be a list of strings (a surreal-redis command line), got {command!r}"], None
    try:
        args = complete(command, {"AGENT_ID_BASE": "0"}, container_name=lambda: "surreal-agent-1.surreal_default",
                        has_checkpoint=lambda _: False)
        at = command_index(args)
    except EntrypointError as exc:
        return [f"{name}: {exc}"], None
    problem, params = parse_command(name, args, at)
    if params is None:
        return [problem], None
    problems: list[str] = []
    experiment = None
    config_path = params.get("config_path")
    if config_path is not None:
        host_path = _config_on_host(config_path, service, compose_dir)
        if host_path is None or not host_path.is_file():
            problems.append(f"{name}: --config {config_path} is not a file mounted into the service "
                            f"({host_path or 'no bind mount covers it'})")
        else:
            try:
                config = load_config(host_path, params["overrides"])
                experiment = (host_path, tuple(sorted(params["overrides"])), config.run)
            except ValueError as exc:
                problems.append(f"{name}: --config {config_path} with {list(params['overrides'])}: {exc}")
    if experiment is not None:  # each process as its run's user of the same name; others as the administrator
        problems += url_problems(name, service, env, experiment[2], args[at] if args[at] in ROLES else None)
    return problems, experiment


def url_problems(name: str, service: Mapping[str, Any], env: Mapping[str, str], run: str, role: str | None) -> list[str]:
    """The service's SURREAL_REDIS_URL must log in as the run's ``role`` user (None: the
    administrator, the default user) with the password the ACL file gives that user."""
    url = _environment(service).get("SURREAL_REDIS_URL")
    if url is None:
        return [f"{name}: no SURREAL_REDIS_URL in its environment"]
    parts = urlsplit(url)
    user, variable = (username(run, role), password_variable(role)) if role else (None, ADMIN_VARIABLE)
    if (parts.username or None) != user:
        return [f"{name}: connects as {parts.username or 'default'!r}, not as {user or 'default'!r}"]
    if unquote(parts.password or "") != env.get(variable):
        return [f"{name}: the password in SURREAL_REDIS_URL is not {variable}"]
    return []


def mlflow_server_problems(args: list[str]) -> list[str]:
    """``mlflow server ARGS`` parsed by the installed MLflow's CLI (the image installs the newest)."""
    from mlflow.cli import server

    try:
        server.make_context("mlflow server", list(args))
    except click.ClickException as exc:
        return [f"mlflow server {' '.join(args)}: {exc.format_message()}"]
    return []


# ---------------------------------------------------------------- one file

def file_problems(path: Path, env: Mapping[str, str]) -> list[str]:
    """Everything this module checks in one compose file but the schema."""
    try:
        doc = load(path, env)
    except (InterpolationError, yaml.YAMLError) as exc:
        return [f"{path.name}: {exc}"]
    services: dict[str, Any] = doc.get("services") or {}
    base = load(path.parent / OVERLAYS[path.name], env).get("services") or {} if path.name in OVERLAYS else {}
    known = set(services) | set(base)
    problems: list[str] = []
    experiments = {}
    for name, service in services.items():
        where = f"{path.name}: {name}"
        if path.name in OVERLAYS and name not in base:
            problems.append(f"{where}: the overlay names a service {OVERLAYS[path.name]} does not have")
        depends = service.get("depends_on") or {}
        for target, condition in (depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends)):
            if target not in known:
                problems.append(f"{where}: depends_on {target!r}, which is not a service")
            elif (condition or {}).get("condition") == "service_healthy":
                health = services[target].get("healthcheck") or {}
                if "test" not in health or "start_interval" not in health:
                    problems.append(f"{where}: waits for {target!r} to be healthy, but {target!r} has no "
                                    "healthcheck with test and start_interval")
        for volume in service.get("volumes") or []:
            source = str(volume).partition(":")[0]
            if source.startswith((".", "/")):
                if not (path.parent / source).exists():
                    problems.append(f"{where}: bind-mounts {source}, which does not exist")
            elif source not in (doc.get("volumes") or {}):
                problems.append(f"{where}: uses volume {source!r}, which is not declared under volumes:")
        build = service.get("build")
        if isinstance(build, dict) and not (path.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).is_file():
            problems.append(f"{where}: build names a Dockerfile that does not exist")
        entrypoint = service.get("entrypoint") or []
        if entrypoint and str(entrypoint[-1]).endswith("/acl_file.py"):
            try:
                acl_file_text(str((service.get("command") or ["?"])[0]), _environment(service))
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
        if entrypoint == ["mlflow", "server"]:
            problems += [f"{where}: {p}" for p in mlflow_server_problems(service.get("command") or [])]
        if str(service.get("image", IMAGE)).startswith(IMAGE) and "entrypoint" not in service:
            if "command" in service:
                found, experiment = command_problems(name, service, env, path.parent)
                problems += [f"{path.name}: {p}" for p in found]
                if experiment is not None:
                    experiments[name] = experiment
            elif "environment" in service:  # the admin tools service: commands come with `run`
                problems += [f"{path.name}: {p}" for p in url_problems(name, service, env, "", None)]
    if len(set(experiments.values())) > 1:
        problems.append(f"{path.name}: the processes run different experiments: "
                        + "; ".join(f"{n}: {e[0].name} {list(e[1])}" for n, e in experiments.items()))
    return problems


def schema_checker_installed() -> bool:
    return importlib.util.find_spec("check_jsonschema") is not None


def schema_problems(paths: list[Path], env: Mapping[str, str]) -> list[str]:
    """check-jsonschema's complaints about the files as written and as interpolated (empty when
    it is not installed: see :func:`schema_checker_installed`)."""
    if not schema_checker_installed():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        rendered = []
        for path in paths:
            try:
                doc = load(path, env)
            except InterpolationError:
                continue  # file_problems reports it
            target = Path(tmp) / f"interpolated-{path.name}"
            target.write_text(yaml.safe_dump(doc, sort_keys=False))
            rendered.append(target)
        result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                                 *map(str, paths), *map(str, rendered)], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return []
    return [f"compose-spec schema: {line}" for line in (result.stdout + result.stderr).splitlines() if line.strip()]


def problems(env: Mapping[str, str], compose_dir: Path = COMPOSE_DIR) -> list[str]:
    """Every problem of the compose files in ``compose_dir`` under ``env``."""
    paths = [compose_dir / name for name in COMPOSE_FILES]
    found = schema_problems(paths, env)
    for path in paths:
        found += file_problems(path, env)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", type=Path, default=None, help="default: .env.example with example passwords")
    options = parser.parse_args(argv)
    # as compose: the shell's variables win over the env file's
    env = {**(read_env_file(options.env_file) if options.env_file else example_env()), **os.environ}
    if not schema_checker_installed():
        print("note: check-jsonschema is not installed (pip install -e '.[dev]'): schema not checked", file=sys.stderr)
    found = problems(env)
    for line in found:
        print(line)
    print(f"{len(found)} problems in {', '.join(COMPOSE_FILES)}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
