"""An opt-in, append-only record of the experience path for exact accounting (the chaos tests).

Off unless the environment variable ``SURREAL_LEDGER_DIR`` names a directory (else senders and
receivers get a :class:`NullLedger`, which records nothing). Each process appends JSON lines to its
own file ``<dir>/<role>-<pid>.jsonl``, one unbuffered ``O_APPEND`` write per line, so lines never
interleave and a ``kill -9`` loses at most the line being written (:func:`read_ledger` skips it).
Records:

- ``{"k": "acked", "tag": <sender tag>, "seq": <batch seq>, "n": <chunks>, "t": <unix time>}``:
  the sender got a batch acknowledged by ``insert.lua`` (its chunks are origins
  ``tag:seq:1..n:n``); on Redis Cluster also ``"node": "<host>:<port>"``, the primary that
  acknowledged it (a failover can lose what a demoted primary acknowledged);
- ``{"k": "trained", "o": [[tag, seq, position, size], ...]}``: the learner acked these chunks,
  i.e. its feed holds them (recorded where the receiver marks them consumed);
- ``{"k": "dead", "o": [...]}``: chunks the receiver set aside (dead-letter stream).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from surreal_redis.hub.experience.wire import Origin, WireError, entry_origin

log = logging.getLogger(__name__)

LEDGER_DIR_ENV = "SURREAL_LEDGER_DIR"


class Ledger:
    """One process's ledger file, opened for appending; one write per JSON record."""

    def __init__(self, directory: Path, role: str) -> None:
        if not role or not role.isidentifier():
            raise ValueError(f"ledger role must be an identifier, got {role!r}")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{role}-{os.getpid()}.jsonl"
        self._file: IO[bytes] = self.path.open("ab", buffering=0)

    @classmethod
    def from_environment(cls, role: str) -> Ledger:
        """The ledger ``SURREAL_LEDGER_DIR`` asks for, or a :class:`NullLedger` when it is unset or
        empty."""
        directory = os.environ.get(LEDGER_DIR_ENV, "")
        if not directory:
            return NullLedger()
        ledger = cls(Path(directory), role)
        log.info("recording the experience ledger in %s", ledger.path)
        return ledger

    def acked(self, tag: str, seq: int, count: int, node: str | None = None) -> None:
        """``node``: ``host:port`` of the cluster primary that acknowledged it (None standalone)."""
        record: dict[str, Any] = {"k": "acked", "tag": tag, "seq": seq, "n": count, "t": round(time.time(), 3)}
        if node is not None:
            record["node"] = node
        self._write(record)

    def trained(self, origins: Iterable[Origin | None]) -> None:
        self._origins("trained", origins)

    def dead(self, origins: Iterable[Origin | None]) -> None:
        self._origins("dead", origins)

    def dead_entries(self, entries: Iterable[Mapping[bytes, bytes]]) -> None:
        """Like :meth:`dead`, from the raw fields of entries that may be malformed (an entry whose
        origin is missing or does not parse is left out)."""
        self.dead(_origin_or_none(fields) for fields in entries)

    def close(self) -> None:
        self._file.close()

    def _origins(self, kind: str, origins: Iterable[Origin | None]) -> None:
        listed = [list(origin) for origin in origins if origin is not None]
        if listed:
            self._write({"k": kind, "o": listed})

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")


class NullLedger(Ledger):
    """The ledger of a run that records none (no ``SURREAL_LEDGER_DIR``): every record is
    dropped unread (lazy arguments are never consumed), and no file is opened."""

    def __init__(self) -> None:  # no file: nothing is written
        pass

    def _ignore(self, *args: Any, **kwargs: Any) -> None:
        pass

    acked = trained = dead = dead_entries = close = _ignore


def _origin_or_none(fields: Mapping[bytes, bytes]) -> Origin | None:
    """The origin of an entry that may be malformed (None when it has none or a bad one)."""
    try:
        return entry_origin(fields)
    except WireError:
        return None


def read_ledger(directory: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of every ledger file in ``directory`` as (file name, record), file by file.
    A last line that does not parse (torn by a kill) is skipped; a bad line before it raises
    ValueError naming the file and line."""
    for path in sorted(directory.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                if number == len(lines):  # no newline after it: the line being written at a kill
                    log.info("%s: skipped a torn last line", path.name)
                    continue
                raise ValueError(f"{path}: line {number} is not JSON: {line[:80]!r}") from None
            yield path.name, record
