"""End to end: the real CLI, real redis-server processes, real gymnasium envs, real training and
MLflow. Slow (a couple of minutes in all) but part of the default suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surreal_redis.connection import connect
from surreal_redis.embedded import EmbeddedRedis, find_redis_server
from surreal_redis.hub.run.control import RunControl
from surreal_redis.hub.run.heartbeat import read_agents

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLI = [sys.executable, "-m", "surreal_redis.cli", "--log-level", "INFO"]
SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"launch exited with {proc.returncode} while waiting for {what}:\n{out[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def mlflow_metrics(experiment_dir: Path) -> dict[str, list[float]]:
    from mlflow.tracking import MlflowClient

    run_id = (experiment_dir / "mlflow_run_id").read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{experiment_dir.resolve()}/mlflow.db")
    run = client.get_run(run_id)
    return {key: [m.value for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}, run


@pytest.fixture
def server():
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    with EmbeddedRedis(maxmemory="256mb") as srv:
        yield srv


def test_launch_status_restart_stop_then_resume(tmp_path, server):
    client = connect(server.url)
    overrides = ["-o", f"experiment.root={tmp_path}", "-o", "stop.max_env_steps=1000000",
                 "-o", "stop.max_seconds=240", "-o", "agent.heartbeat_ttl_s=10"]
    proc = subprocess.Popen([*CLI, "launch", SMOKE, "--agents", "2", "--redis-url", server.url, *overrides],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def both_stepping():  # each agent has sent a heartbeat after its first steps; the learner reported
            stepping = [a for a in read_agents(client, "smoke", 10) if not a.stale and a.steps > 0]
            return stepping if len(stepping) == 2 and RunControl(client, "smoke").learner_status() else None

        agents = wait_for(both_stepping, 120, "two agents stepping", proc)
        status = cli("status", "--run", "smoke", "--redis-url", server.url, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "agents: 2 alive" in status.stdout and "learner: pid" in status.stdout
        assert "shard 0:" in status.stdout

        victim = next(a for a in agents if a.agent_id == "0")
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: any(a.agent_id == "0" and a.pid != victim.pid and not a.stale
                             for a in read_agents(client, "smoke", 10)), 90, "agent 0 to be restarted", proc)
        learner = json.loads(client.get("sr:{smoke}:learner"))
        wait_for(lambda: json.loads(client.get("sr:{smoke}:learner"))["iteration"] > learner["iteration"] + 1,
                 90, "the run to go on after the restart", proc)

        stopped = cli("stop", "--run", "smoke", "--redis-url", server.url, cwd=tmp_path)
        assert stopped.returncode == 0 and "stop requested" in stopped.stdout
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert "agent-0 exited with code -9" in out and "restarting agent-0" in out
    assert "run 'smoke' finished (surreal-redis stop)" in out

    experiment = tmp_path / "smoke"
    checkpoints = sorted((experiment / "checkpoints").glob("ckpt-*.pt"))
    assert checkpoints, "no checkpoint written"
    metrics, run = mlflow_metrics(experiment)
    assert run.info.status == "FINISHED"
    for key in ("charts/env_steps", "charts/episode_return_mean", "losses/policy_loss", "hub/stream_unread",
                "hub/policy_staleness_p50", "hub/policy_lag_share_0", "hub/policy_lag_share_9_up"):
        assert key in metrics, f"{key} not logged (have {sorted(metrics)})"
    assert run.data.params["algo"] == "ppo" and run.data.params["ppo.learning_rate"] == "0.001"
    last_iteration = int(checkpoints[-1].stem.split("-")[1])

    # --resume continues from the latest checkpoint (same experiment folder, same MLflow run)
    resumed = cli("launch", SMOKE, "--agents", "1", "--redis-url", server.url, "--resume",
                  "-o", f"experiment.root={tmp_path}", "-o", "stop.max_seconds=400", "-o", "eval.enabled=false",
                  "-o", "stop.max_env_steps=" + str(int(metrics["charts/env_steps"][-1]) + 1500), cwd=tmp_path,
                  timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    learner_log = (experiment / "logs" / "learner.log").read_text()
    assert f"iteration {last_iteration}," in learner_log.split("resumed from")[1].splitlines()[0]
    after = sorted(int(p.stem.split("-")[1]) for p in (experiment / "checkpoints").glob("ckpt-*.pt"))
    assert after[-1] > last_iteration
    metrics_after, run_after = mlflow_metrics(experiment)
    assert run_after.info.run_id == run.info.run_id
    assert len(metrics_after["charts/env_steps"]) > len(metrics["charts/env_steps"])


def test_smoke_config_runs_to_completion_on_embedded_redis(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    done = cli("launch", SMOKE, "--agents", "2", "-o", f"experiment.root={tmp_path}", "-o", "eval.every_s=30",
               "-o", "eval.every_updates=5", "-o", "tracking.curve_every_env_steps=250", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 'smoke' finished" in done.stderr
    experiment = tmp_path / "smoke"
    assert list((experiment / "checkpoints").glob("ckpt-*.pt"))
    metrics, run = mlflow_metrics(experiment)
    assert run.info.status == "FINISHED"
    assert metrics["charts/env_steps"][-1] >= 8000
    assert "charts/eval_return" in metrics
    # the run ends with an eval of its final checkpoint, scored into best-k (keep_best: 1)
    final = max(int(p.stem.split("-")[1]) for p in (experiment / "checkpoints").glob("ckpt-*.pt"))
    line = next(line for line in done.stderr.splitlines() if line.startswith("  final eval of update"))
    assert line.startswith(f"  final eval of update {final} (the final checkpoint): mean return ") and \
        " over 10 of 10 episodes in " in line, line
    score = float(line.split("mean return ")[1].split()[0])
    (best_score, best_update), = json.loads((experiment / "checkpoints" / "best.json").read_text())
    assert best_update == final if best_score == pytest.approx(score, abs=0.05) else best_score > score
    check_curves(experiment, metrics, score)
    assert not (experiment / "hub.json").exists()  # announced while the run lived only

    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke"]  # children write into the run's folder only

    rolled = cli("rollout", str(experiment), "--episodes", "2", cwd=tmp_path)
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    result = json.loads(rolled.stdout.strip().splitlines()[-1])
    assert len(result["returns"]) == 2 and all(r >= 1 for r in result["returns"])
    latest = max((experiment / "checkpoints").glob("ckpt-*.pt"))
    assert result["checkpoint"] == str(latest.resolve()) and f"checkpoint {latest.resolve()}" in rolled.stderr
    best = cli("rollout", str(sorted((experiment / "checkpoints").glob("ckpt-*.pt"))[0]), "--episodes", "1",
               "--mode", "stochastic", cwd=tmp_path)
    assert best.returncode == 0, best.stderr[-2000:]


def check_curves(experiment: Path, metrics: dict[str, list[float]], final_score: float) -> None:
    """The data behind curves.png: the train curve from the first episodes, a point per 250 env
    steps (of 8000, less those of the episodes the stop cut); the evals (per 5 of 31 updates, once
    the eval process is up: the whole run is a few seconds) and the final eval last, at the final
    env steps; the same series in the MLflow run."""
    from surreal_redis import plots

    assert (experiment / "curves.png").read_bytes()[:4] == b"\x89PNG"
    curves = plots.read_run(experiment)
    train, evaluated, final = curves.series
    assert (train.kind, evaluated.kind, final.kind, curves.window) == ("train", "eval", "final", 20)
    assert len(train.returns) >= 20, train
    assert train.env_steps[0] <= 500  # the first episode (a CartPole episode is at most 500 steps)
    assert sorted(metrics["curve/train_return"]) == sorted(train.returns)
    assert len(evaluated.returns) >= 2 and evaluated.env_steps == tuple(sorted(evaluated.env_steps)), evaluated
    assert final.returns == (pytest.approx(final_score, abs=0.05),) == (evaluated.returns[-1],)
    assert final.env_steps == (evaluated.env_steps[-1],) == (metrics["charts/env_steps"][-1],)
    assert sorted(metrics["curve/eval_return"]) == sorted(evaluated.returns)


@pytest.mark.parametrize("args, message", [
    (["launch", SMOKE, "-o", "ppo.lr=1"], "ppo.lr"),
    (["launch", SMOKE, "-o", "agent.num_agents=many"], "agent.num_agents"),
    (["launch", "no-such-config.yaml"], "no-such-config.yaml"),
    (["agent", "--id", "0", "--config", SMOKE, "--redis-url", "redis://127.0.0.1:1/0", "-o", "redis.startup_wait_s=2"],
     "cannot reach Redis at redis://127.0.0.1:1/0 (waited 2 s"),
    (["agent", "--id", "0", "--config", SMOKE, "--redis-url", "redis://127.0.0.1:1/0", "-o", "redis.startup_wait_s=-1"],
     "startup_wait_s must be >= 0, got -1"),
    (["launch", SMOKE, "-o", "env.env_id=NoSuchEnv-v9"], "NoSuchEnv-v9"),
    (["agent", "--id", "0", "--config", SMOKE], "SURREAL_REDIS_URL"),
    (["launch", SMOKE, "--agents", "0"], "'--agents': 0"),
    (["launch", SMOKE, "-o", "agent.num_agents=0"], "agent.num_agents=0"),
    (["launch", SMOKE, "-o", "stop.max_seconds=0"], "max_seconds must be > 0"),
    (["launch", SMOKE, "-o", "learner.max_restarts=-1"], "max_restarts must be >= 0, got -1"),
])
def test_cli_errors_name_the_problem(tmp_path, args, message):
    env = {k: v for k, v in os.environ.items() if k != "SURREAL_REDIS_URL"}
    done = subprocess.run([*CLI, *args, *(["-o", f"experiment.root={tmp_path}"] if args[0] == "launch" else [])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    done = cli("rollout", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert done.returncode != 0 and "nowhere" in done.stderr
    (tmp_path / "exp" / "checkpoints").mkdir(parents=True)
    (tmp_path / "exp" / "config.yaml").write_text("algo: ppo\n")
    done = cli("rollout", str(tmp_path / "exp"), cwd=tmp_path)
    assert done.returncode != 0 and "no checkpoint" in done.stderr


def test_default_config_round_trips(tmp_path):
    for algo in ("ppo", "ddpg"):
        done = cli("default-config", algo, cwd=tmp_path)
        assert done.returncode == 0
        path = tmp_path / f"{algo}.yaml"
        path.write_text(done.stdout)
        from surreal_redis.config import load_config

        assert load_config(path).algo == algo


def test_acl_command_creates_working_users(tmp_path, server):
    import redis

    done = cli("acl", "--run", "secure", "--redis-url", server.url, "--agent-password", "agent-pw", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "agent: user sr-secure-agent" in done.stdout and "learner: user sr-secure-learner" in done.stdout
    agent = redis.Redis(unix_socket_path=str(server.socket_path), username="sr-secure-agent", password="agent-pw")
    assert agent.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.hset("sr:{secure.p}:meta", "version", 99)


def test_ctrl_c_stops_every_process_cleanly(tmp_path, server):
    """SIGINT to the launcher's whole process group, as a terminal's Ctrl-C does: the learner
    still writes its final checkpoint and the MLflow run is closed as KILLED."""
    client = connect(server.url)
    proc = subprocess.Popen([*CLI, "launch", SMOKE, "--agents", "1", "--redis-url", server.url,
                             "-o", f"experiment.root={tmp_path}", "-o", "stop.max_env_steps=10000000",
                             "-o", "stop.max_seconds=600", "-o", "checkpoint.every_updates=1000"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: (client.get("sr:{smoke}:learner") or b"{}") and
                 json.loads(client.get("sr:{smoke}:learner") or b"{}").get("iteration", 0) >= 2,
                 120, "two learner updates", proc)
        pids = [a.pid for a in read_agents(client, "smoke", 30)]
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-4000:]  # interrupted, not finished (0)
    assert "run 'smoke' interrupted (signal SIGINT; MLflow marks it KILLED)" in out
    learner_log = (tmp_path / "smoke" / "logs" / "learner.log").read_text()
    assert "learner stopped" in learner_log and "second SIGTERM" not in learner_log
    iterations = [int(p.stem.split("-")[1]) for p in (tmp_path / "smoke" / "checkpoints").glob("ckpt-*.pt")]
    assert max(iterations) >= 2  # the final checkpoint (periodic ones come only every 1000)
    _, run = mlflow_metrics(tmp_path / "smoke")
    assert run.info.status == "KILLED"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_learner_crash_stops_the_run_with_a_clear_message(tmp_path, server):
    """With no learner restart left (learner.max_restarts=0; restarts: test_supervision.py)."""
    client = connect(server.url)
    proc = subprocess.Popen([*CLI, "launch", SMOKE, "--agents", "1", "--redis-url", server.url,
                             "-o", f"experiment.root={tmp_path}", "-o", "stop.max_env_steps=10000000",
                             "-o", "stop.max_seconds=600", "-o", "learner.max_restarts=0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        status = wait_for(lambda: json.loads(client.get("sr:{smoke}:learner") or b"{}"), 120, "the learner", proc)
        agents = wait_for(lambda: read_agents(client, "smoke", 30), 60, "the agent", proc)
        os.kill(status["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "learner crashed with exit code -9; stopping the run" in out
    assert "run 'smoke' FAILED (the learner crashed" in out
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(agents[0].pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the agent outlived the failed run")


def test_redis_command_serves_until_interrupted(tmp_path):
    if find_redis_server() is None:
        pytest.skip("no redis-server")
    proc = subprocess.Popen([*CLI, "redis", "--maxmemory", "64mb"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("unix://"), url
        client = connect(url)
        assert client.ping() and client.config_get("maxmemory")["maxmemory"] == str(64 * 2**20)
        socket_dir = Path(url.split("://", 1)[1].split("?")[0]).parent
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not socket_dir.exists()
