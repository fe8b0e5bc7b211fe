"""``surreal-redis agent`` by hand: which config it runs, and a refusal instead of a silent wait."""

import pytest
from click.testing import CliRunner

from surreal_redis.cli import main
from surreal_redis.config import load_config
from surreal_redis.hub.run.control import RunControl


@pytest.mark.parametrize("args, which", [([], "neither"), (["--config", "smoke", "--run", "smoke"], "both")])
def test_an_agent_needs_either_a_run_or_a_config(args, which):
    done = CliRunner().invoke(main, ["agent", "--id", "0", "--redis-url", "redis://127.0.0.1:1/0", *args])
    assert done.exit_code == 2
    assert f"agent needs --run NAME (the config its launcher stored in Redis) or --config FILE, not {which}" \
        in done.output


def test_an_agent_of_a_run_takes_the_config_its_launcher_stored(redis_server, real_redis, monkeypatch):
    started = []

    class Agent:  # stands in for the real one: records what it was built with
        def __init__(self, config, client, agent_id, stop):
            started.append((config, agent_id))

        def run(self):
            return 0

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr("surreal_redis.agent.Agent", Agent)
    monkeypatch.setattr("surreal_redis.cli.processes._exit_process", leave)
    stored = load_config("smoke", ["experiment.name=mine", "env.num_envs=3", "agent.nice=0"])
    RunControl(real_redis, "mine").store_config(stored.to_yaml())
    done = CliRunner().invoke(main, ["agent", "--id", "1", "--run", "mine", "--redis-url", redis_server.url])
    assert done.exit_code == 0, done.output
    ((config, agent_id),) = started
    assert (config.run, config.env.num_envs, agent_id, config.redis.url) == ("mine", 3, 1, redis_server.url)
    missing = CliRunner().invoke(main, ["agent", "--id", "1", "--run", "nobody", "--redis-url", redis_server.url])
    assert missing.exit_code == 1 and "no config stored in Redis for run 'nobody'" in missing.output
