"""Write the Redis ACL file of one run (``aclfile`` in compose/redis.conf).

Users: ``default``, the administrator (every key, channel and command: healthchecks, ``status``,
``stop``, ``gc``), and one user per role of :mod:`surreal_redis.acl` (``sr-<run>-agent``,
``sr-<run>-learner``) with exactly the rules ``surreal-redis acl`` gives them. Passwords come from
``$SURREAL_ADMIN_PASSWORD`` and ``$SURREAL_<ROLE>_PASSWORD``; the file holds only their SHA-256.
They go into ``redis://user:password@host`` URLs unescaped, so they must be URL-safe.

    python acl_file.py RUN PATH      # compose's ``acl`` service runs this before Redis starts
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from surreal_redis.acl import ROLES, acl_rules, username

ADMIN_VARIABLE = "SURREAL_ADMIN_PASSWORD"
MIN_PASSWORD_LENGTH = 16
_URL_SAFE = re.compile(r"^[A-Za-z0-9_~.-]+$")


def password_variable(role: str) -> str:
    """The environment variable holding ``role``'s password: ``SURREAL_<ROLE>_PASSWORD``."""
    return f"SURREAL_{role.upper()}_PASSWORD"


def _password_hash(env: Mapping[str, str], variable: str) -> str:
    password = env.get(variable, "")
    if len(password) < MIN_PASSWORD_LENGTH or not _URL_SAFE.match(password):
        # the message names the variable, never the password
        raise ValueError(f"{variable} must be at least {MIN_PASSWORD_LENGTH} characters from A-Z a-z 0-9 _ ~ . - "
                         f"(it goes into redis:// URLs unescaped); it is {len(password)} characters"
                         + ("" if not password or _URL_SAFE.match(password) else " with others among them"))
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file_text(run: str, env: Mapping[str, str], num_shards: int | None = None) -> str:
    """The ACL file: one ``user`` line each for ``default`` and every role of ``run``.
    Raises ValueError naming a missing or unsafe password variable, or a bad run name."""
    lines = [f"user default on #{_password_hash(env, ADMIN_VARIABLE)} ~* &* +@all"]
    for role in ROLES:
        rules = " ".join(acl_rules(run, role, num_shards))
        lines.append(f"user {username(run, role)} reset on #{_password_hash(env, password_variable(role))} {rules}")
    return "\n".join(lines) + "\n"


def write_acl_file(path: Path, run: str, env: Mapping[str, str]) -> None:
    """Replace ``path`` atomically (readable by the redis user of the Redis image)."""
    text = acl_file_text(run, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.chmod(0o644)
    partial.replace(path)


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: python acl_file.py RUN PATH")
    run, path = argv
    try:
        write_acl_file(Path(path), run, os.environ)
    except ValueError as exc:
        sys.exit(f"acl_file: {exc}")
    print(f"wrote the ACL file of run {run!r} ({', '.join(['default'] + [username(run, r) for r in ROLES])}) to {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
