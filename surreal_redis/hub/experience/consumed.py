"""What the learner consumed, per sender: so a chunk delivered a second time is dropped.

Redis replicates asynchronously: a primary that dies after the learner moved, read and acked
chunks takes all that and ``move.lua``'s dedup window with it, and the promoted replica still
holds those batches. Every stream entry names its origin
(:class:`~surreal_redis.hub.experience.wire.Origin`), so the learner remembers what it stored.

Per sender: the seqs of batches all of whose chunks were consumed, as sorted disjoint ranges, and
the indices consumed of the batches not complete yet. Memory is bounded: at most ``max_ranges``
ranges per sender (beyond, the oldest gap is closed: a chunk of it arriving later would be
dropped, counted in ``gaps_closed``), ``max_partial`` incomplete batches (beyond, the oldest is
counted complete, in ``partial_closed``), and ``max_senders`` senders (the least recently consumed
is forgotten, in ``senders_forgotten``). Chunks without an origin are never dropped. Not
thread-safe: the receiver locks.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from surreal_redis.hub.experience.wire import Origin

STATE_VERSION = 1


@dataclass
class _Sender:
    starts: list[int] = field(default_factory=list)  # ranges [starts[i], ends[i]] of complete seqs
    ends: list[int] = field(default_factory=list)
    partial: dict[int, tuple[int, set[int]]] = field(default_factory=dict)  # seq -> (count, indices)

    def complete(self, seq: int) -> bool:
        i = bisect.bisect_right(self.starts, seq) - 1
        return i >= 0 and seq <= self.ends[i]

    def add_complete(self, seq: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, seq)  # ranges before i start at or below seq
        joins_left = i > 0 and ends[i - 1] + 1 >= seq
        joins_right = i < len(starts) and starts[i] == seq + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = max(ends[i - 1], seq)
        elif joins_right:
            starts[i] = seq
        else:
            starts.insert(i, seq)
            ends.insert(i, seq)


@dataclass(frozen=True)
class ConsumedStats:
    """``gaps_closed``/``partial_closed``/``senders_forgotten``: what the memory bounds gave up."""

    senders: int
    gaps_closed: int
    partial_closed: int
    senders_forgotten: int


class ConsumedWindow:
    """:meth:`seen` tells whether a chunk was consumed; :meth:`add` records one."""

    def __init__(self, max_senders: int = 4096, max_ranges: int = 32, max_partial: int = 64) -> None:
        for name, value in (("max_senders", max_senders), ("max_ranges", max_ranges), ("max_partial", max_partial)):
            if value < 1:
                raise ValueError(f"consumed window {name} must be >= 1, got {value}")
        self.max_senders, self.max_ranges, self.max_partial = max_senders, max_ranges, max_partial
        self._senders: OrderedDict[str, _Sender] = OrderedDict()  # least recently consumed first
        self.gaps_closed = self.partial_closed = self.senders_forgotten = 0

    def seen(self, origin: Origin) -> bool:
        sender = self._senders.get(origin.sender)
        if sender is None:
            return False
        if sender.complete(origin.seq):
            return True
        part = sender.partial.get(origin.seq)
        return part is not None and origin.position in part[1]

    def add(self, origin: Origin) -> None:
        sender = self._senders.get(origin.sender)
        if sender is None:
            sender = self._senders[origin.sender] = _Sender()
            if len(self._senders) > self.max_senders:
                self._senders.popitem(last=False)
                self.senders_forgotten += 1
        else:
            self._senders.move_to_end(origin.sender)
        if sender.complete(origin.seq):
            return
        count, indices = sender.partial.setdefault(origin.seq, (origin.size, set()))
        indices.add(origin.position)
        if len(indices) >= count:
            del sender.partial[origin.seq]
            sender.add_complete(origin.seq)
        if len(sender.partial) > self.max_partial:
            oldest = min(sender.partial)
            del sender.partial[oldest]
            sender.add_complete(oldest)
            self.partial_closed += 1
        if len(sender.starts) > self.max_ranges:  # close the oldest gap
            sender.ends[0] = sender.ends[1]
            del sender.starts[1], sender.ends[1]
            self.gaps_closed += 1

    def stats(self) -> ConsumedStats:
        return ConsumedStats(len(self._senders), self.gaps_closed, self.partial_closed, self.senders_forgotten)

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain ints, strings and lists (a weights-only checkpoint holds them), oldest sender first."""
        return {"version": STATE_VERSION,
                "senders": [[uuid, [list(r) for r in zip(s.starts, s.ends)],
                             [[seq, count, sorted(indices)] for seq, (count, indices) in sorted(s.partial.items())]]
                            for uuid, s in self._senders.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the window with a :meth:`state_dict`; ValueError naming what is wrong."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise ValueError(f"consumed window state must be a dict with version {STATE_VERSION}, "
                             f"got {str(state)[:100]!r}")
        senders: OrderedDict[str, _Sender] = OrderedDict()
        for row in state.get("senders", []):
            try:
                uuid, ranges, partial = row
                sender = _Sender([int(a) for a, _ in ranges], [int(b) for _, b in ranges],
                                 {int(seq): (int(count), {int(i) for i in indices}) for seq, count, indices in partial})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"consumed window state: bad sender row {str(row)[:100]!r} ({exc})") from None
            bounds = [b for pair in zip(sender.starts, sender.ends) for b in pair]
            if not isinstance(uuid, str) or bounds != sorted(bounds) or any(
                    a <= b for a, b in zip(sender.starts[1:], sender.ends)):  # ordered, disjoint
                raise ValueError(f"consumed window state: bad sender row {str(row)[:100]!r}")
            senders[uuid] = sender
        while len(senders) > self.max_senders:
            senders.popitem(last=False)
        self._senders = senders
