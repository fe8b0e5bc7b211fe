"""The experience receiver's settings (``hub.receiver``), read by the receiver and the readers
it delegates to. Sizes in bytes, times in seconds unless named ``_ms``."""

from __future__ import annotations

from dataclasses import dataclass

from surreal_redis.hub.experience.inbox import DEAD_MAXLEN, MOVE_ITEMS, SEEN_TTL_S


@dataclass(frozen=True)
class ReceiverConfig:
    """Experience receiver settings."""

    consumer: str = "learner"
    """This reader's name in the consumer group (a restarted learner with the same name gets its own
    pending entries back at once)."""
    block_ms: int = 1000
    """Default wait of a receive."""
    cache_entries: int = 8192
    """Decoded observation arrays kept by digest (this and ``cache_bytes`` both bound the cache)."""
    cache_bytes: int = 64 << 20
    max_obs_bytes: int = 64 << 20
    """Decoded size of one observation blob beyond which it is refused (never fetched: a blob is
    fetched only when its size is within what its template's dtype and shape allow)."""
    max_payload_bytes: int = 16 << 20
    """Bytes of one chunk payload, stored and decoded: a payload blob bigger than this is set aside
    unfetched (its key and size are its dead letter), one declaring more decoded bytes undecoded,
    and a stream entry holds at most this, capped at 1 MiB (the inline bound of ``insert.lua``;
    bigger payloads travel as blobs). Honest chunks are far below it (a 64-step chunk without its
    referenced observations: tens of KiB)."""
    max_read_bytes: int = 256 << 20
    """Bytes one read fetches and decodes (payload blobs, payloads decoded, observations not cached
    counted at their template's size), each counted before it is fetched or decoded: entries past
    it wait for the next read (the first always goes), so a read holds about this much plus one
    entry's, plus its stream entries (at most ``max_payload_bytes`` or 1 MiB each)."""
    verify_digests: bool = True
    """Check blake2b(blob) == digest for every fetched observation blob (payload blobs are named by
    random ids, not digests)."""
    claim_min_idle_ms: int = 60_000
    """Take over entries pending this long on other consumers (a dead learner's)."""
    claim_every_s: float = 30.0
    """How often to look for such entries (then the group's other consumers with nothing pending
    are removed)."""
    claim_count: int = 100
    """Entries per claim or pending-list read."""
    dead_maxlen: int = DEAD_MAXLEN
    """Approximate cap of the dead-letter stream."""
    move_items: int = MOVE_ITEMS
    """Inbox batches per ``move.lua`` call."""
    seen_ttl_s: int = SEEN_TTL_S
    """How long a sender's dedup window is kept after its last batch (a batch resent later than
    that would be stored twice)."""
    retained_batch: int = 256
    """Entries per XRANGE of a read of the retained window."""
    retry_base_s: float = 0.1
    """Backoff of setting entries aside while Redis is out of memory (up to ``retry_cap_s``)."""
    retry_cap_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.consumer or not isinstance(self.consumer, str):
            raise ValueError(f"receiver.consumer must be a non-empty string, got {self.consumer!r}")
        for name in ("block_ms", "cache_entries", "cache_bytes", "claim_min_idle_ms", "claim_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"receiver.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("claim_count", "dead_maxlen", "retained_batch", "max_obs_bytes", "seen_ttl_s",
                     "max_payload_bytes", "max_read_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"receiver.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.retry_base_s <= self.retry_cap_s:
            raise ValueError(f"need 0 < receiver.retry_base_s <= retry_cap_s, got {self.retry_base_s}, "
                             f"{self.retry_cap_s}")
        if not 1 <= self.move_items <= 256:
            raise ValueError(f"receiver.move_items must be in 1..256, got {self.move_items}")
