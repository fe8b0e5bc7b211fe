"""Exact accounting of a chaos run from the experience ledger (surreal_redis.hub.experience.ledger).

Every chunk an agent got acknowledged (origin ``tag:seq:position:size``) ends in one class:

- trained once / trained twice (acked by the learner twice: must never happen);
- dead-lettered (the receiver set it aside);
- unread at the stop: still in the stream (or the inbox) when the run ended, the backlog the
  learner reports;
- trimmed: gone from the stream without being trained, covered by the trims the learner logs
  (``entries trimmed before the learner read them``, memory pressure's ``N of them unread``,
  ``trimmed while pending``) -- only as many as were reported;
- lost with a failover: gone from the stream untrained, and acknowledged by a Cluster primary
  (the ledger's ``node``) that was demoted afterwards, at most ``FAILOVER_WINDOW_S`` before the
  fault that demoted it (Redis replicates asynchronously: a replica promoted over a primary
  killed or frozen lacks the tail that primary had not sent yet). On a standalone Redis with
  ``appendfsync always`` nothing acknowledged may be lost: a partition delays it, a kill -9
  keeps it in the AOF; such a loss is unaccounted;
- unaccounted: everything else (must be 0).

Chunks trained that no agent's ledger acknowledged (an agent killed between insert.lua's reply
and its ledger line) are counted apart; they are not a loss. So is a chunk of the last ``trained``
line of a learner the test killed that a later learner trained again: the line is written just
before the XACK, and a kill -9 in between leaves the entry pending, handed to the next learner
(the dead one's feed went with it); counted as ``retrained_after_kill``, not as twice.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from surreal_redis.hub.experience.ledger import read_ledger
from surreal_redis.hub.experience.wire import Origin

FAILOVER_WINDOW_S = 2.0  # replication lag here is milliseconds; an older unreplicated write is a bug

TRIM_PATTERNS = (
    re.compile(r"(\d+) entries trimmed before the learner read them"),
    re.compile(r"memory pressure: trimmed \d+ entries \((\d+) of them unread"),
    re.compile(r"(\d+) entries were trimmed while pending"),
)


def reported_trims(log_text: str) -> int:
    """Unread entries the learner's log says were trimmed (all its lives: the log is appended)."""
    return sum(int(m.group(1)) for pattern in TRIM_PATTERNS for m in pattern.finditer(log_text))


class Demotion(NamedTuple):
    """A Cluster primary the test saw demoted: ``node`` (host:port) had ``fault`` (a kill -9, a
    SIGSTOP) at unix time ``fault_at`` and was seen as a replica at ``seen_at``."""

    node: str
    fault: str
    fault_at: float
    seen_at: float


class Accounting(NamedTuple):
    acknowledged: int
    trained_once: int
    trained_twice: int
    dead_lettered: int
    unread_at_stop: int
    trimmed: int
    unaccounted: int
    lost_with_failover: int
    lost_by_demotion: dict[Demotion, list[float]]  # seconds before the fault each lost chunk was acked
    trained_without_ack_record: int
    retrained_after_kill: int
    reported_trims: int
    examples: dict[str, list[Origin]]

    def table(self, faults: Counter, finished: str, lost: str = "n/a (standalone Redis, no partitions)") -> str:
        """The run's table; ``lost``: what the "lost with a failover or partition" row says when no
        demoted primary lost anything (else the row counts them by demotion)."""
        if self.lost_by_demotion:
            lost = f"{self.lost_with_failover}: " + "; ".join(
                f"{len(ages)} acked by {d.node} {-max(ages):+.2f} to {-min(ages):+.2f} s from its {d.fault}"
                f" at {time.strftime('%H:%M:%S', time.localtime(d.fault_at))}, demoted"
                for d, ages in sorted(self.lost_by_demotion.items(), key=lambda item: item[0].fault_at))
        rows = [("faults injected", ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none"),
                ("chunks acknowledged", self.acknowledged),
                ("trained once", self.trained_once),
                ("trained twice (must be 0)", self.trained_twice),
                ("dropped: dead-lettered", self.dead_lettered),
                ("dropped: trimmed unread (reported)", f"{self.trimmed} (log reports {self.reported_trims})"),
                ("unread at the stop (in stream/inbox)", self.unread_at_stop),
                ("lost with a failover or partition", lost),
                ("unaccounted (must be 0)", self.unaccounted),
                ("trained, no ack line (agent killed)", self.trained_without_ack_record),
                ("retrained: kill -9 between line and XACK", self.retrained_after_kill),
                ("stop condition, all alive", finished)]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        for kind, origins in self.examples.items():
            if origins:
                lines.append(f"{kind}: e.g. {', '.join(':'.join(map(str, o)) for o in origins[:5])}")
        return "\n".join(lines)


def account(directory: Path, in_stream: Iterable[Origin], trims_reported: int,
            killed_learners: Iterable[int] = (), demotions: Iterable[Demotion] = ()) -> Accounting:
    """Classify every acknowledged chunk of the ledger files in ``directory``. ``in_stream``: the
    origins of the entries left in the run's streams after the run (inbox moved in first);
    ``trims_reported``: :func:`reported_trims` of the learner's log; ``killed_learners``: pids
    of the learner processes the test killed; ``demotions``: the Cluster primaries the test saw
    demoted."""
    acked: set[Origin] = set()
    acked_by: dict[Origin, tuple[str, float]] = {}  # cluster runs: the primary that acknowledged it, when
    trained: Counter[Origin] = Counter()
    dead: set[Origin] = set()
    killed_files = {f"learner-{pid}.jsonl" for pid in killed_learners}
    last_line: dict[str, list[Origin]] = {}  # killed learner's file -> origins of its last trained line
    for name, record in read_ledger(directory):
        kind = record["k"]
        if kind == "trained" and name in killed_files:
            last_line[name] = [Origin(*o) for o in record["o"]]
        if kind == "acked":
            n = record["n"]
            batch = [Origin(record["tag"], record["seq"], i, n) for i in range(1, n + 1)]
            acked.update(batch)
            if "node" in record:
                acked_by.update((origin, (record["node"], record["t"])) for origin in batch)
        elif kind == "trained":
            trained.update(Origin(*o) for o in record["o"])
        elif kind == "dead":
            dead.update(Origin(*o) for o in record["o"])
        else:
            raise ValueError(f"unknown ledger record kind {kind!r}")
    retrained = 0
    for origins in last_line.values():
        for origin in origins:
            if trained[origin] > 1:  # the copy the next learner got from the pending list
                trained[origin] -= 1
                retrained += 1
    stream = set(in_stream)
    once = [o for o in acked if trained[o] == 1]
    twice = sorted(o for o in acked if trained[o] > 1) + sorted(o for o in trained if o not in acked and trained[o] > 1)
    rest = [o for o in acked if trained[o] == 0]
    dead_lettered = [o for o in rest if o in dead]
    unread = [o for o in rest if o not in dead and o in stream]
    gone = sorted(o for o in rest if o not in dead and o not in stream)
    lost: dict[Demotion, list[float]] = {}
    by_node = sorted(demotions, key=lambda d: d.seen_at)
    kept = []
    for origin in gone:
        demotion = None
        if origin in acked_by:
            node, at = acked_by[origin]
            demotion = next((d for d in by_node if d.node == node and d.fault_at - FAILOVER_WINDOW_S <= at <= d.seen_at),
                            None)
        if demotion is None:
            kept.append(origin)
        else:
            lost.setdefault(demotion, []).append(demotion.fault_at - acked_by[origin][1])
    trimmed = kept[:trims_reported]
    unaccounted = kept[trims_reported:]
    return Accounting(len(acked), len(once), len(twice), len(dead_lettered), len(unread), len(trimmed),
                      len(unaccounted), sum(map(len, lost.values())), lost,
                      sum(1 for o in trained if o not in acked), retrained, trims_reported,
                      {"trained twice": twice, "unaccounted": unaccounted})
