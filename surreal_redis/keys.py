"""Every Redis key name of the project is built here, and nowhere else.

Layout (``docs/concepts.md``): ``sr:{run}:...`` run-wide, ``sr:{run.sN}:...`` experience shard N,
``sr:{run.p}:...`` parameters. The braces are a Redis Cluster hash tag, so every Lua script
touches a single slot.

Shard placement: shard N's tag is ``{run.sN.K}`` with the smallest salt K (none: ``{run.sN}``)
that puts its slot in the N-th window of :data:`SHARD_SLOT_WINDOWS`, whose first n windows lie
in n different n-ths of the slot space for every n up to 12. ``redis-cli --cluster create``
gives P primaries P equal runs of slots, so num_shards <= 12 spread evenly over the primaries
(exactly when a multiple of P, else within one shard per
primary), and a shard's tag never depends on num_shards. Shards 12 and up
keep ``{run.sN}``. A resharded cluster moves keys with their slots: only the balance may change
(``status`` shows which node serves each shard).

Run names never contain ``.`` (the tag separator) nor a glob character, so the tag of one run can
never be read as the tag of another (``{ppo.p}`` is run ``ppo``'s, never a run named ``ppo.p``),
and every pattern built here matches the keys of its own run only (the ACL users and ``gc --drop``
rely on that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from redis.crc import key_slot

PREFIX = "sr"
CONSUMER_GROUP = "learner"
_RUN_NAME = re.compile(r"[A-Za-z0-9_\-]{1,100}")
# The one grammar of observation digests (codec.digest: blake2b-128 in lower-case hex). The Lua
# scripts that read digests (insert, move, gc) carry the same pattern in their DIGEST line;
# tests/faults/test_hostile_agents.py checks that both agree on the real server.
DIGEST_CHARS = 32
_DIGEST = re.compile(f"[0-9a-f]{{{DIGEST_CHARS}}}")
_PUBLISHER_ID = re.compile(r"[0-9a-f]{8,64}")
# (first, last) slot of shard N's target window: the middle half of cell N of a 12-point Steinhaus
# sequence (the first n cells lie in distinct intervals [k/n, (k+1)/n) of the slot space, n <= 12;
# found by a depth-first search; tests/unit/test_keys.py checks it), so each window stays >= 24 slots
# away from any primary's edge.
SHARD_SLOT_WINDOWS: tuple[tuple[int, int], ...] = (
    (7633, 8006), (12008, 12195), (3754, 3982), (14116, 14263), (1877, 1991), (9411, 9508), (6004, 6097),
    (15360, 16042), (341, 1023), (10550, 10798), (4740, 4856), (13182, 13330),
)


def is_digest(text: str) -> bool:
    """Whether ``text`` is an observation digest: exactly DIGEST_CHARS lower-case hex digits."""
    return isinstance(text, str) and _DIGEST.fullmatch(text) is not None


def validate_run_name(run: str) -> str:
    """Return ``run`` if it is usable inside key names, else raise ``ValueError`` naming it."""
    if not isinstance(run, str) or not _RUN_NAME.fullmatch(run):
        raise ValueError(
            f"invalid run name {run!r}: use 1-100 characters from letters, digits, '_' and '-' "
            "('.' separates the shard and parameter tags of key names)"
        )
    return run


@lru_cache(maxsize=4096)
def shard_tag(run: str, shard: int) -> str:
    """``sr:{run.sN}`` or ``sr:{run.sN.K}`` (module docstring); a few hundred CRC16s at most."""
    plain = f"{PREFIX}:{{{run}.s{shard}}}"
    if shard >= len(SHARD_SLOT_WINDOWS):
        return plain
    first, last = SHARD_SLOT_WINDOWS[shard]
    salt = 0
    tag = plain
    while not first <= key_slot(tag.encode()) <= last:
        salt += 1
        tag = f"{PREFIX}:{{{run}.s{shard}.{salt}}}"
    return tag


@dataclass(frozen=True)
class ShardKeys:
    """Key names of one experience shard (all in the hash slot ``{run.sN}``)."""

    run: str
    shard: int

    @property
    def tag(self) -> str:
        return shard_tag(self.run, self.shard)

    @property
    def slot(self) -> int:
        """The Redis Cluster hash slot of every key of this shard."""
        return key_slot(self.tag.encode())

    @property
    def exp(self) -> str:
        """Stream of experience chunks."""
        return f"{self.tag}:exp"

    @property
    def inbox(self) -> str:
        """List the agents append insert batches to; the learner's ``move.lua`` moves them into
        :attr:`exp`."""
        return f"{self.tag}:inbox"

    @property
    def pinned(self) -> str:
        """Set of digests referenced by batches still in :attr:`inbox` (gc spares them)."""
        return f"{self.tag}:pinned"

    @property
    def obsref(self) -> str:
        """Sorted set digest -> millisecond part of the newest entry id referencing it."""
        return f"{self.tag}:obsref"

    @property
    def dead(self) -> str:
        """Dead-letter stream of malformed entries set aside by the receiver."""
        return f"{self.tag}:dead"

    @property
    def obs_prefix(self) -> str:
        return f"{self.tag}:obs:"

    def obs(self, digest: str) -> str:
        """String key of one blob: an observation leaf or frame (named by its digest), or a chunk
        payload stored apart (named by an id in the same grammar bound to its batch: wire.payload_id)."""
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"invalid observation digest {digest!r}")
        return f"{self.tag}:obs:{digest}"

    def obs_keys(self, digests: list[str]) -> list[str]:
        """:meth:`obs` of each digest (one call for a whole insert)."""
        prefix, match = self.obs_prefix, _DIGEST.fullmatch
        bad = next((d for d in digests if not match(d)), None)
        if bad is not None:
            raise ValueError(f"invalid observation digest {bad!r}")
        return [prefix + d for d in digests]

    def digest_of(self, obs_key: str) -> str:
        """Inverse of :meth:`obs`."""
        prefix = self.obs_prefix
        if not obs_key.startswith(prefix):
            raise ValueError(f"{obs_key!r} is not an observation key of shard {self.shard}")
        return obs_key[len(prefix) :]

    @property
    def reads(self) -> str:
        """Pub/sub channel on which the learner announces each read of new entries from
        :attr:`exp` (payload: how many), for senders waiting on its backlog."""
        return f"{self.tag}:reads"

    @property
    def seen(self) -> str:
        """Hash sender uuid -> that sender's dedup window (the batch seqs ``move.lua`` stored),
        written by the learner only."""
        return f"{self.tag}:seen"


@dataclass(frozen=True)
class ParamKeys:
    """Key names of the parameter store (all in the hash slot ``{run.p}``)."""

    run: str

    @property
    def tag(self) -> str:
        return f"{PREFIX}:{{{self.run}.p}}"

    @property
    def meta(self) -> str:
        return f"{self.tag}:meta"

    @property
    def notify(self) -> str:
        """Pub/sub channel on which each new version number is announced."""
        return f"{self.tag}:notify"

    @property
    def quota(self) -> str:
        """Hash (version, left): env steps the learner still wants for one version (lockstep)."""
        return f"{self.tag}:quota"

    def blob(self, version: int) -> str:
        if int(version) < 0:
            raise ValueError(f"parameter version must be >= 0, got {version}")
        return f"{self.tag}:blob:{int(version)}"

    def staging(self, publisher_id: str) -> str:
        """Where one publisher uploads a blob before the publish script renames it to ``blob:<v>``
        (so a stale publisher can never overwrite a published blob)."""
        if not _PUBLISHER_ID.fullmatch(publisher_id):
            raise ValueError(f"invalid publisher id {publisher_id!r} (need 8-64 lowercase hex characters)")
        return f"{self.tag}:staging:{publisher_id}"


@dataclass(frozen=True)
class RunKeys:
    """All key names of one run (experiment)."""

    run: str

    def __post_init__(self) -> None:
        validate_run_name(self.run)

    @property
    def tag(self) -> str:
        return f"{PREFIX}:{{{self.run}}}"

    @property
    def config(self) -> str:
        return f"{self.tag}:config"

    @property
    def agents(self) -> str:
        """Hash agent id -> heartbeat JSON."""
        return f"{self.tag}:agents"

    @property
    def episodes(self) -> str:
        """Stream of finished training episodes, moved from :attr:`episodes_inbox` (``drain.lua``)."""
        return f"{self.tag}:episodes"

    @property
    def episodes_inbox(self) -> str:
        """List the agents append training-episode records to (JSON); only the learner removes."""
        return f"{self.tag}:episodes:inbox"

    @property
    def evals(self) -> str:
        """Stream of eval episodes, written by the eval process only (its own ACL user): the
        scores behind best-k checkpoints and ``stop.target_metric: eval``."""
        return f"{self.tag}:evals"

    @property
    def control(self) -> str:
        """Hash with the run state (running / stopping)."""
        return f"{self.tag}:control"

    @property
    def learner(self) -> str:
        """String: the learner's status JSON (iteration, version, env steps, returns), with a TTL."""
        return f"{self.tag}:learner"

    @property
    def lease(self) -> str:
        """String with a TTL: the launch that owns the run (random token, pid, host, folder),
        renewed while it lives (:mod:`surreal_redis.hub.run.lease`)."""
        return f"{self.tag}:lease"

    def shard(self, index: int) -> ShardKeys:
        if int(index) < 0:
            raise ValueError(f"shard index must be >= 0, got {index}")
        return ShardKeys(self.run, int(index))

    def shards(self, count: int) -> list[ShardKeys]:
        return [self.shard(i) for i in range(count)]

    @property
    def params(self) -> ParamKeys:
        return ParamKeys(self.run)

    def acl_patterns(self, num_shards: int | None = None) -> dict[str, list[str]]:
        """Glob patterns of this run's keys by kind (the key names above; ``shards``, ``run`` and
        ``params``: every key of a shard, the run, the parameters; ``notify`` and ``reads``: the
        pub/sub channels), for ACL rules (``surreal_redis.acl``). With ``num_shards`` the shard
        patterns name each shard exactly; without, they match any shard number. Either way they
        match no key of another run.
        """
        tags = ([self.shard(i).tag for i in range(num_shards)] if num_shards is not None
                else [f"{PREFIX}:{{{self.run}.s[0-9]*}}"])
        params = self.params

        def shard(suffix: str) -> list[str]:
            return [f"{tag}:{suffix}" for tag in tags]

        return {
            "exp": shard("exp"), "inbox": shard("inbox"), "pinned": shard("pinned"), "obsref": shard("obsref"),
            "seen": shard("seen"), "obs": shard("obs:*"),
            "dead": shard("dead"), "shards": shard("*"),
            "config": [self.config], "agents": [self.agents], "episodes": [self.episodes],
            "episodes_inbox": [self.episodes_inbox], "evals": [self.evals],
            "control": [self.control], "learner": [self.learner], "run": [f"{self.tag}:*"],
            "meta": [params.meta], "blob": [f"{params.tag}:blob:*"], "quota": [params.quota],
            "params": [f"{params.tag}:*"],
            "notify": [params.notify], "reads": shard("reads"),
        }

    def all_patterns(self) -> list[str]:
        """SCAN patterns covering every key of this run and no key of another (``gc --drop``)."""
        return [f"{self.tag}:*", f"{PREFIX}:{{{self.run}.s[0-9]*}}:*", f"{self.params.tag}:*"]
