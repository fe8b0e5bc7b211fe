"""Entrypoint of the surreal-redis image (compose/Dockerfile): run a ``surreal-redis`` command line.

Its arguments are a ``surreal-redis`` command line, run with exec (so signals reach it directly)
after two substitutions only a container can make:

- ``--id auto`` (agents, which compose scales with ``deploy.replicas``): the replica number ``n``
  of this container, named ``<project>-<service>-<n>`` by compose, gives ``$AGENT_ID_BASE + n - 1``
  (Docker's DNS, asked directly, answers a reverse lookup of a container's own address with its
  name; /etc/hosts would give the container id). ``$AGENT_ID``
  replaces the lookup (one agent started by hand); no other fallback, since two agents with one id
  would share a seed and a heartbeat.
- ``--resume auto`` (the learner, restarted by compose after a crash): ``--resume latest`` when the
  experiment folder already holds a checkpoint, else nothing (a fresh run).

    python entrypoint.py agent --id auto --config /configs/ppo_cartpole.yaml
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PROGRAM = "surreal-redis"
AUTO = "auto"
_REPLICA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*?[-_](\d+)$")


class EntrypointError(RuntimeError):
    """The command line cannot be completed here (the message says why and what to set)."""


def replica_number(container_name: str) -> int:
    """The replica number ``n`` (1-based) in a compose container name ``<project>-<service>-<n>``
    (older compose: ``<project>_<service>_<n>``), optionally followed by ``.<network>``."""
    match = _REPLICA_NAME.match(container_name.split(".", 1)[0])
    if match is None or int(match.group(1)) < 1:
        raise EntrypointError(f"container name {container_name!r} does not end in a compose replica number "
                              "(-<n>); set AGENT_ID to choose the agent id")
    return int(match.group(1))


def _read_name(message: bytes, offset: int) -> tuple[str, int]:
    """A DNS name at ``offset`` (labels, maybe ending in a compression pointer) and the offset after it."""
    labels: list[str] = []
    end = None
    for _ in range(128):  # bounds a pointer loop in a malformed reply
        length = message[offset]
        if length >= 0xC0:  # pointer to an earlier name
            end = offset + 2 if end is None else end
            offset = ((length & 0x3F) << 8) | message[offset + 1]
        elif length == 0:
            return ".".join(labels), offset + 1 if end is None else end
        else:
            labels.append(message[offset + 1:offset + 1 + length].decode("ascii"))
            offset += 1 + length
    raise EntrypointError("malformed DNS reply (a name loops)")


def ptr_query(address: str, query_id: int) -> bytes:
    """A DNS query for the PTR record of IPv4 ``address`` (``d.c.b.a.in-addr.arpa``)."""
    labels = [*reversed(address.split(".")), "in-addr", "arpa"]
    name = b"".join(bytes([len(label)]) + label.encode("ascii") for label in labels) + b"\0"
    return struct.pack(">6H", query_id, 0x0100, 1, 0, 0, 0) + name + struct.pack(">2H", 12, 1)


def ptr_answer(reply: bytes, query_id: int) -> str:
    """The first PTR name in a DNS ``reply`` to query ``query_id``; EntrypointError if it has none."""
    try:
        reply_id, flags, questions, answers = struct.unpack(">4H", reply[:8])
        if reply_id != query_id or flags & 0x000F or answers == 0:
            raise EntrypointError(f"the DNS server has no name for this address (reply code {flags & 0x000F}, "
                                  f"{answers} answers)")
        offset = 12
        for _ in range(questions):
            offset = _read_name(reply, offset)[1] + 4
        for _ in range(answers):
            offset = _read_name(reply, offset)[1]
            record_type, _, _, length = struct.unpack(">HHIH", reply[offset:offset + 10])
            if record_type == 12:
                return _read_name(reply, offset + 10)[0]
            offset += 10 + length
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EntrypointError(f"malformed DNS reply ({exc})") from None
    raise EntrypointError("the DNS reply holds no PTR record")


def reverse_lookup(address: str, server: tuple[str, int], timeout_s: float = 2.0) -> str:
    """The PTR name of ``address``, asked of the DNS ``server`` itself: not through /etc/hosts, which
    in a container maps the container's address to its id. Blocks up to ``timeout_s``."""
    query_id = secrets.randbits(16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(ptr_query(address, query_id), server)
        reply, _ = sock.recvfrom(4096)
    return ptr_answer(reply, query_id)


def own_container_name(resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    """This container's name: Docker's DNS (the nameserver in /etc/resolv.conf) answers a reverse
    lookup of a container's address with ``<container name>.<network>``. Blocks up to 2 s."""
    try:
        nameserver = next(line.split()[1] for line in resolv_conf.read_text().splitlines()
                          if line.startswith("nameserver") and len(line.split()) > 1)
        return reverse_lookup(socket.gethostbyname(socket.gethostname()), (nameserver, 53))
    except (OSError, StopIteration) as exc:
        raise EntrypointError(f"cannot look up this container's name ({exc or 'no nameserver'}); set AGENT_ID "
                              "to choose the agent id") from None


def agent_id(env: Mapping[str, str], container_name: Callable[[], str] = own_container_name) -> int:
    """``$AGENT_ID`` if set, else ``$AGENT_ID_BASE`` (default 0) + this replica's number - 1."""
    def as_id(name: str, default: str) -> int:
        text = env.get(name, "").strip() or default
        if not text.isdigit():
            raise EntrypointError(f"{name} must be a whole number >= 0, got {text!r}")
        return int(text)

    if env.get("AGENT_ID", "").strip():
        return as_id("AGENT_ID", "0")
    return as_id("AGENT_ID_BASE", "0") + replica_number(container_name()) - 1


def learner_has_checkpoint(args: Sequence[str]) -> bool:
    """Whether the experiment folder of ``learner ARGS`` holds a checkpoint (``--resume-from``'s
    folder when given). Parses ARGS with the CLI itself and loads the config (a few seconds)."""
    import click

    from surreal_redis.checkpoint import CheckpointManager
    from surreal_redis.cli.processes import learner
    from surreal_redis.config import load_config

    try:
        params = learner.make_context("learner", list(args)).params
        if params["run_name"] is not None:
            raise EntrypointError("--resume auto needs --config (the experiment folder comes from the config)")
        config = load_config(params["config_path"], params["overrides"])
    except (click.ClickException, ValueError) as exc:  # ConfigError is a ValueError
        raise EntrypointError(f"cannot read the learner's command line or config: {exc}") from None
    folder = Path(params["resume_from"]) if params["resume_from"] is not None else config.experiment_dir
    return bool(CheckpointManager(folder / "checkpoints", config.checkpoint).iterations())


def command_index(args: Sequence[str]) -> int:
    """Where the subcommand is in a ``surreal-redis`` command line (after the group's ``--log-level``)."""
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] == "--log-level" else 1
    if at >= len(args):
        raise EntrypointError(f"no surreal-redis command in {list(args)!r}")
    return at


def complete(args: Sequence[str], env: Mapping[str, str],
             container_name: Callable[[], str] = own_container_name,
             has_checkpoint: Callable[[Sequence[str]], bool] = learner_has_checkpoint) -> list[str]:
    """``args`` (a ``surreal-redis`` command line without the program name) with ``--id auto`` and
    ``--resume auto`` replaced as the module docstring says; everything else unchanged."""
    args = list(args)
    start = command_index(args)
    command, options = args[start], args[start + 1:]
    for option, only_for in (("--id", "agent"), ("--resume", "learner")):
        if option not in options[:-1] or options[options.index(option) + 1] != AUTO:
            continue
        if command != only_for:
            raise EntrypointError(f"{option} {AUTO} is only for the {only_for} command, not {command!r}")
        at = options.index(option)
        if option == "--id":
            options[at + 1] = str(agent_id(env, container_name))
        else:
            options[at + 1] = "latest"
            if not has_checkpoint(options):
                del options[at:at + 2]
    return args[:start + 1] + options


def main(argv: Sequence[str]) -> None:
    """Replace this process by ``surreal-redis ARGV`` (completed); exit 1 with a message if it cannot be."""
    try:
        args = complete(argv, os.environ)
    except EntrypointError as exc:
        sys.exit(f"entrypoint: {exc}")
    os.execvp(PROGRAM, [PROGRAM, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
