import time

import numpy as np
import pytest

from surreal_redis.hub.experience.backlog import dedup_ratio
from surreal_redis.hub.experience.inbox import move_inbox
from surreal_redis.hub.experience.sender import ExperienceSender, SenderConfig
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import Heartbeat, read_agents
from surreal_redis.keys import RunKeys
from surreal_redis.scripts import Scripts
from surreal_redis.status import render_status


def send_frame_stacks(client, steps=40, num_envs=2):
    """A 4-frame stack stream: each step brings one new 84x84 frame per env (moved from the inbox
    into the stream, as the learner does)."""
    sender = ExperienceSender(client, SenderConfig(flush_steps=10, dedup_min_bytes=1024), "st", 0, 1)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8) for _ in range(4)]
    for _ in range(steps):
        obs = tuple(frames)
        frames = frames[1:] + [rng.integers(0, 255, (num_envs, 84, 84), dtype=np.uint8)]
        sender.add(obs, np.zeros(num_envs, np.int64), np.ones(num_envs, np.float32),
                   np.zeros(num_envs, bool), np.zeros(num_envs, bool))
    move_inbox(Scripts(client), RunKeys("st").shard(0))
    return sender


def test_dedup_ratio_counts_frame_sharing(fake_redis):
    send_frame_stacks(fake_redis)
    keys = RunKeys("st").shard(0)
    entries = fake_redis.xlen(keys.exp)
    ratio, blobs = dedup_ratio(fake_redis, keys, entries)
    # each entry: 11 stacked observations x 4 frames, of which 10 + 3 are distinct (boundary
    # observations are shared with the neighbouring chunk, so blobs are fewer still)
    assert entries >= 6
    assert blobs <= entries * 13
    assert ratio >= 44 / 13


def test_render_status_lists_agents_shards_and_memory(real_redis):
    send_frame_stacks(real_redis)
    RunControl(real_redis, "st").start()
    Heartbeat(real_redis, "st", 0, ttl_s=30).beat(steps=80, episodes=3, param_version=5)
    text = render_status(real_redis, "st")
    assert "state: running" in text and "learner: no report" in text
    assert "agents: 1 alive, 0 stale" in text and " v5" in text
    assert "shard 0: " in text and ("dedup 3." in text or "dedup 4." in text), text
    assert "redis memory:" in text


def test_render_status_shows_how_the_run_uses_experience_and_time(fake_redis, monkeypatch):
    monkeypatch.setattr(fake_redis, "info", lambda section: {"used_memory_human": "1M"})  # fakeredis lacks INFO
    RunControl(fake_redis, "st").write_learner_status(
        {"iteration": 3, "version": 4, "env_steps": 300, "steps_per_s": 10.0, "updates_per_s": 0.1, "mean_return": None,
         "eval_return": None, "pid": 1, "time": time.time(), "state": "running", "sync": "lockstep",
         "experience_used_fraction": 0.987, "policy_lag_p90": 1, "learner_busy": 0.6, "agent_idle": 0.25,
         "learner_busy_total": 0.5, "agent_idle_total": 0.2}, ttl_s=60)
    Heartbeat(fake_redis, "st", 0, ttl_s=30).beat(steps=80, episodes=3, param_version=4, idle_s=3.0, running_s=12.0)
    Heartbeat(fake_redis, "st", 1, ttl_s=30).beat(steps=80, episodes=3, param_version=4)  # loop not started yet
    text = render_status(fake_redis, "st")
    assert ("  experience used 98.7%, policy lag p90 1, learner busy 60%, agents idle 25% [lockstep]" in text), text
    rows = [line for line in text.splitlines() if " v4 " in line]
    assert rows[0].split()[-1] == "25%" and rows[1].split()[-1] == "-", rows


def test_render_status_of_an_older_learner_shows_dashes(fake_redis, monkeypatch):
    monkeypatch.setattr(fake_redis, "info", lambda section: {"used_memory_human": "1M"})
    RunControl(fake_redis, "st").write_learner_status(
        {"iteration": 3, "version": 4, "env_steps": 300, "steps_per_s": 10.0, "updates_per_s": 0.1, "mean_return": None,
         "eval_return": None, "pid": 1, "time": time.time(), "state": "stopped"}, ttl_s=60)
    assert "  experience used -, policy lag p90 -, learner busy -, agents idle -\n" in render_status(fake_redis, "st")


def test_heartbeats_carry_idle_time_and_refuse_negative_seconds(fake_redis):
    beat = Heartbeat(fake_redis, "st", 5, ttl_s=30)
    beat.beat(10, 0, 1, idle_s=1.5, running_s=6.0)
    (agent,) = read_agents(fake_redis, "st", ttl_s=30)
    assert (agent.idle_s, agent.running_s, agent.idle_fraction) == (1.5, 6.0, 0.25)
    with pytest.raises(ValueError, match="-1.0"):
        beat.beat(10, 0, 1, idle_s=-1.0, running_s=6.0)


# ---------------------------------------------------------------- finding a local run by name

def announce(root, run, url, pid=None, pid_start="same"):
    """A hub.json as a launcher of ``run`` writes it (this test process stands in for the launcher)."""
    import json
    import os

    from surreal_redis.run_folder import RunFolder, _process_start

    folder = root / run
    folder.mkdir(parents=True, exist_ok=True)
    path = RunFolder(folder).announce(run, url)
    if pid is not None or pid_start != "same":
        data = json.loads(path.read_text())
        data["pid"] = os.getpid() if pid is None else pid
        data["pid_start"] = _process_start(os.getpid()) if pid_start == "same" else pid_start
        path.write_text(json.dumps(data))
    return folder


def dead_pid():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_live_local_runs_skip_files_of_launchers_that_are_gone(tmp_path):
    from surreal_redis.run_folder import live_local_runs

    announce(tmp_path, "alive", "unix:///a.sock")
    announce(tmp_path, "killed", "unix:///b.sock", pid=dead_pid())
    announce(tmp_path, "reused", "unix:///c.sock", pid_start="1")  # our pid now, but another process's start
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "hub.json").write_text("{not json")
    assert [(run.name, run.url) for run in live_local_runs(tmp_path)] == [("alive", "unix:///a.sock")]


def test_find_run_takes_the_url_a_live_launcher_of_that_run_announced(tmp_path):
    from surreal_redis.status import RunNotFound, find_run

    assert find_run(None, "redis://h:1/0", tmp_path) == ("default", "redis://h:1/0")  # nothing local: as before
    with pytest.raises(RunNotFound, match=r"no live local runs under .* \(none\): pass --run NAME --redis-url URL"):
        find_run(None, None, tmp_path)
    announce(tmp_path, "ppo_cartpole", "unix:///tmp/x/redis.sock")
    assert find_run(None, None, tmp_path) == ("ppo_cartpole", "unix:///tmp/x/redis.sock")
    assert find_run("ppo_cartpole", None, tmp_path) == ("ppo_cartpole", "unix:///tmp/x/redis.sock")
    assert find_run(None, "unix:///tmp/x/redis.sock", tmp_path) == ("ppo_cartpole", "unix:///tmp/x/redis.sock")
    assert find_run("other", "redis://h:1/0", tmp_path) == ("other", "redis://h:1/0")
    with pytest.raises(RunNotFound, match=r"no live local run named 'other' .*live: ppo_cartpole \(unix:///tmp/x"):
        find_run("other", None, tmp_path)
    announce(tmp_path, "ddpg", "unix:///tmp/y/redis.sock")
    with pytest.raises(RunNotFound, match=r"2 live local runs under .*ddpg \(unix:///tmp/y/redis.sock\), "
                                          r"ppo_cartpole \(unix:///tmp/x/redis.sock\)\): pass --run NAME$"):
        find_run(None, None, tmp_path)
    assert find_run("ddpg", None, tmp_path) == ("ddpg", "unix:///tmp/y/redis.sock")


def test_a_hub_file_is_removed_by_its_own_launcher_only(tmp_path):
    import json

    from surreal_redis.run_folder import RunFolder

    folder = announce(tmp_path, "r", "unix:///a.sock", pid=dead_pid())  # a later launcher's file
    RunFolder(folder).withdraw()
    assert (folder / "hub.json").exists()
    data = json.loads((folder / "hub.json").read_text())
    announce(tmp_path, "r", "unix:///a.sock")
    RunFolder(folder).withdraw()
    assert not (folder / "hub.json").exists() and data["run"] == "r"
    RunFolder(folder).withdraw()  # gone already: nothing to do


def test_status_of_a_run_this_redis_does_not_hold_says_so(fake_redis, monkeypatch):
    monkeypatch.setattr(fake_redis, "info", lambda section: {"used_memory_human": "1M"})
    text = render_status(fake_redis, "default")
    assert "state: unknown: no run of that name in this Redis (--run takes the experiment.name)" in text
    RunControl(fake_redis, "default").store_config("algo: ppo\n")
    assert "state: unknown\n" in render_status(fake_redis, "default")


def test_status_and_stop_reach_the_only_live_local_run_by_its_folder(tmp_path, redis_server, real_redis,
                                                                     monkeypatch):
    """No --run, no URL: the quick start's case (an embedded Redis, a run named after its config)."""
    from click.testing import CliRunner

    from surreal_redis.cli import main

    monkeypatch.delenv("SURREAL_REDIS_URL", raising=False)
    control = RunControl(real_redis, "ppo_cartpole")
    control.start()
    control.write_learner_status({"iteration": 40, "version": 57, "env_steps": 10240, "steps_per_s": 900.0,
                                  "updates_per_s": 3.5, "mean_return": 120.0, "eval_return": None, "pid": 4242,
                                  "time": time.time(), "state": "running"}, ttl_s=60)
    announce(tmp_path / "runs", "ppo_cartpole", redis_server.url)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(main, ["status"])
    assert shown.exit_code == 0, shown.output
    assert "run 'ppo_cartpole'" in shown.output and "learner: pid 4242, update 40, params v57" in shown.output
    stopped = runner.invoke(main, ["stop"])
    assert stopped.exit_code == 0 and f"stop requested for run 'ppo_cartpole' at {redis_server.url}" in stopped.output
    assert control.stopping() == (True, "surreal-redis stop")
    missing = runner.invoke(main, ["status", "--run", "other"])
    assert missing.exit_code == 2 and "no live local run named 'other'" in missing.output
    dropped = runner.invoke(main, ["gc", "--drop"])
    assert dropped.exit_code == 2 and "name it with --run" in dropped.output
    assert real_redis.exists(RunKeys("ppo_cartpole").control)
