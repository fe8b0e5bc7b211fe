"""The shard inboxes: agents append insert batches (``lua/insert.lua``); the learner moves them into
the shard stream (``lua/move.lua``), storing each (sender uuid, seq) once, in queue order, and
setting aside items that are not batches; once the inbox is empty, move.lua scores the pins in
obsref for gc."""

from __future__ import annotations

from typing import NamedTuple

from surreal_redis.keys import ShardKeys
from surreal_redis.scripts import Scripts


class Moved(NamedTuple):
    """What one ``move.lua`` call did: inbox items taken, stream entries added, items dropped as
    copies of a stored batch, malformed items set aside, items left in the inbox, items set aside
    because storing them failed (the error is their dead letter's detail), and, once the inbox is
    empty, pins left to score in obsref (a call scores 1024; gc spares a pinned blob), and items
    set aside because a chunk names a payload blob not bound to its batch (another agent's, or
    one of its own batches': ``wire.payload_id``)."""

    taken: int
    added: int
    duplicates: int
    malformed: int
    left: int
    failed: int
    pins: int = 0
    unbound: int = 0

    @property
    def done(self) -> bool:
        """Nothing left for another call: the inbox is empty and every pin scored."""
        return not self.left and not self.pins

    @property
    def set_aside(self) -> dict[str, int]:
        """Dead letters this call wrote, by reason (for the receiver's counts)."""
        return {reason: n for reason, n in (("malformed_batch", self.malformed), ("script_error", self.failed),
                                                    ("unbound_payload", self.unbound)) if n}


MOVE_BYTES = 4 << 20  # a move.lua call takes no more items once it holds this many bytes
# insert.lua's own bound on a chunk's fields (an inline payload and its a, e, o fields): bigger
# payloads travel apart (the sender stores them under a blob id whatever payload_ref_min_bytes says)
MAX_INLINE_BYTES = 1 << 20
# Defaults of the receiver's move settings (``ReceiverConfig``), which every mover of a run uses.
MOVE_ITEMS = 64
SEEN_TTL_S = 3600
DEAD_MAXLEN = 10_000


def move_call(keys: ShardKeys, max_items: int = MOVE_ITEMS, seen_ttl_s: int = SEEN_TTL_S,
              dead_maxlen: int = DEAD_MAXLEN, max_payload_bytes: int = MAX_INLINE_BYTES) -> tuple[list, list]:
    """The keys and arguments of one ``move.lua`` call (see :func:`move_inbox`)."""
    return ([keys.inbox, keys.exp, keys.obsref, keys.seen, keys.pinned, keys.dead],
            [max_items, seen_ttl_s * 1000, dead_maxlen, MOVE_BYTES, min(max_payload_bytes, MAX_INLINE_BYTES)])


def moved_from(reply: list) -> Moved:
    """A ``move.lua`` reply as :class:`Moved`."""
    return Moved(*(int(value) for value in reply))


def move_inbox(scripts: Scripts, keys: ShardKeys, max_items: int = MOVE_ITEMS, seen_ttl_s: int = SEEN_TTL_S,
               dead_maxlen: int = DEAD_MAXLEN, max_payload_bytes: int = MAX_INLINE_BYTES) -> Moved:
    """Move up to ``max_items`` (1..256) of the agents' queued batches of one shard into its stream,
    stopping early once ``MOVE_BYTES`` are taken (needs the learner's rights); malformed items go
    to the shard's dead-letter stream (approximate cap ``dead_maxlen``; a preview of the item, not
    the item), and so do batches with a chunk whose fields hold more than ``max_payload_bytes``
    (capped by ``MAX_INLINE_BYTES``), so no stream entry is bigger; a sender's dedup window is
    kept ``seen_ttl_s`` after its last batch. One round trip; it runs in a full Redis too.
    Connection errors propagate (a later call moves the rest, storing nothing twice); a refusal
    (ScriptError) has written nothing."""
    script_keys, args = move_call(keys, max_items, seen_ttl_s, dead_maxlen, max_payload_bytes)
    return moved_from(scripts.call("move", script_keys, args))
