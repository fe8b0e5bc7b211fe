"""``surreal-redis status``: a plain-text table of one run's state, read from Redis only; and
how ``status``, ``stop`` and ``gc`` find a run launched on this machine, by the announcements
live launches keep in their run folders (:mod:`surreal_redis.run_folder`).
"""

from __future__ import annotations

import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from surreal_redis.connection import RedisClient, as_text
from surreal_redis.hub.experience.backlog import dedup_ratio, read_backlog
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents
from surreal_redis.keys import CONSUMER_GROUP, RunKeys, ShardKeys
from surreal_redis.learner.metrics import fmt_number, use_summary
from surreal_redis.redis_cluster import is_cluster, primary_clients
from surreal_redis.run_folder import DEFAULT_RUNS_DIR, LocalRun, live_local_runs


class RunNotFound(ValueError):
    """No run, or more than one, matches what ``status``/``stop`` were given; the message lists the live ones."""


def _listing(runs: list[LocalRun]) -> str:
    return ", ".join(f"{run.name} ({run.url})" for run in runs) or "none"


def find_run(run: str | None, url: str | None, root: Path = DEFAULT_RUNS_DIR,
             default_run: str = "default") -> tuple[str, str]:
    """(run name, Redis URL) for ``status``/``stop``/``gc`` given ``--run`` and ``--redis-url``
    (either may be None): a missing URL is the one a live local run of that name announced; a
    missing name is that of the only live local run (on ``url`` when given; with a URL and no
    local run on it, ``default_run``, the default experiment.name). RunNotFound otherwise."""
    local = live_local_runs(root)
    if url and run:
        return run, url
    if url:
        on_url = [r for r in local if r.url == url]
        if len(on_url) > 1:
            raise RunNotFound(f"{len(on_url)} live local runs use {url}: {_listing(on_url)}; pass --run NAME")
        return (on_url[0].name if on_url else default_run), url
    if run:
        named = [r for r in local if r.name == run]
        if not named:
            raise RunNotFound(f"no live local run named {run!r} under {root} (live: {_listing(local)}) and no Redis "
                              f"URL: pass --redis-url or set SURREAL_REDIS_URL")
        return run, named[0].url
    if len(local) != 1:
        raise RunNotFound(f"{'no' if not local else len(local)} live local runs under {root} "
                          f"({_listing(local)}): pass --run NAME{' --redis-url URL' if not local else ''}")
    return local[0].name, local[0].url


def _num_shards(client: RedisClient, run: str) -> int:
    count = 0
    while client.exists(RunKeys(run).shard(count).exp, RunKeys(run).shard(count).inbox):
        count += 1
    return count


def shard_lines(client: RedisClient, keys: ShardKeys) -> str:
    backlog = read_backlog(client, keys)
    dead = client.xlen(keys.dead)
    try:
        pending = client.xpending(keys.exp, CONSUMER_GROUP)["pending"]
    except redis.ResponseError:
        pending = 0
    ratio, blobs = dedup_ratio(client, keys, backlog.length)
    where = f" on {client.get_node_from_key(keys.exp).name}" if isinstance(client, RedisCluster) else ""
    return (f"  shard {keys.shard}{where}: {backlog.length} entries, {backlog.unread} unread "
            f"({backlog.queued} batches queued), {pending} pending, "
            f"{dead} dead-lettered, {blobs} obs blobs, dedup {fmt_number(ratio, unit='x')}")


def render_status(client: RedisClient, run: str) -> str:
    keys = RunKeys(run)
    lines = [f"run {run!r}"]
    stopping, reason = RunControl(client, run).stopping()
    state = client.hget(keys.control, "state")
    if state is None and not client.exists(keys.config, keys.learner):
        lines.append("state: unknown: no run of that name in this Redis (--run takes the experiment.name)")
    else:
        lines.append(f"state: {as_text(state or b'unknown')}{' (' + reason + ')' if stopping and reason else ''}")
    learner = RunControl(client, run).learner_status()
    if learner:
        age = time.time() - float(learner["time"])
        lines.append(f"learner: pid {learner['pid']}, update {learner['iteration']}, params v{learner['version']}, "
                     f"{learner['env_steps']} env steps ({learner['steps_per_s']:.0f}/s), "
                     f"{learner['updates_per_s']:.1f} updates/s, return {fmt_number(learner['mean_return'])}, "
                     f"eval {fmt_number(learner['eval_return'])}, {learner.get('state', 'running')}, reported {age:.0f}s ago")
        lines.append(f"  {use_summary(learner, whole_run=learner.get('state', 'running') != 'running')}")
    else:
        lines.append("learner: no report")
    agents = read_agents(client, run, ttl_s=30.0)
    lines.append(f"agents: {sum(not a.stale for a in agents)} alive, {sum(a.stale for a in agents)} stale")
    if agents:
        lines.append(f"  {'id':>6} {'host':<16} {'pid':>7} {'age s':>6} {'steps':>10} {'episodes':>9} {'params':>7} "
                     f"{'idle':>5}")
        for a in sorted(agents, key=lambda a: (len(a.agent_id), a.agent_id)):
            lines.append(f"  {a.agent_id:>6} {a.host[:16]:<16} {a.pid:>7} {a.age_s:>6.1f} {a.steps:>10} "
                         f"{a.episodes:>9} {'v' + str(a.param_version):>7} {fmt_number(a.idle_fraction, '.0f', 100, '%'):>5}{'  STALE' if a.stale else ''}")
    shards = _num_shards(client, run)
    lines.append(f"experience: {shards} shard(s)")
    for index in range(shards):
        lines.append(shard_lines(client, keys.shard(index)))
    for node in primary_clients(client):  # a cluster: one line per primary
        memory = node.info("memory")
        limit = memory.get("maxmemory", 0)
        name = f" ({node.get_connection_kwargs().get('host')}:{node.get_connection_kwargs().get('port')})" \
            if is_cluster(client) else ""
        lines.append(f"redis memory{name}: {memory['used_memory_human']} used"
                     + (f" of {limit / 2**20:.0f} MB maxmemory ({memory.get('maxmemory_policy')})" if limit else ""))
    return "\n".join(lines)
