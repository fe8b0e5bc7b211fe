"""The processes of a run: ``launch`` (all of them), and ``agent``, ``learner`` and ``eval`` one
at a time."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from surreal_redis.cli.common import (
    _exit_process,
    _fail_cleanly,
    _load,
    _one_blas_thread,
    _single_threaded_torch,
    _waiting_client,
    config_option,
    override_option,
    resume_options,
    run_option,
    url_option,
)
from surreal_redis.connection import resolve_url
from surreal_redis.runtime import StopFlag, lower_priority, lower_thread_priority

if TYPE_CHECKING:
    from surreal_redis.config import ExperimentConfig

log = logging.getLogger(__name__)

STANDBY_NICE = 19
"""How much nicer ``eval --checkpoint -`` builds its env and networks ahead of its final eval."""


@click.command()
@click.argument("config_path", metavar="CONFIG")
@click.option("--agents", type=click.IntRange(min=1), default=None, help="Number of agents (agent.num_agents).")
@url_option
@override_option
@resume_options
@click.option("--fresh", is_flag=True,
              help="Start over when the experiment folder holds an earlier run: move it to <folder>.<time> first "
                   "(refused while that run is live).")
@click.pass_context
@_fail_cleanly
def launch(ctx: click.Context, config_path: str, agents: int | None, redis_url: str | None,
           overrides: tuple[str, ...], resume: str | None, resume_from: Path | None, fresh: bool) -> None:
    """Run an experiment: embedded Redis (without a URL), learner, agents and eval.

    Restarts crashed agents, eval and learner (from its latest checkpoint), rides out Redis
    outages, and refuses to mix a new run into a folder holding an earlier one (see --resume, --fresh).
    A run that is live (its launcher on this host, its learner in a shared Redis) is refused before
    anything is moved or deleted.

    Ctrl-C (or SIGTERM) stops cleanly: the learner saves a final checkpoint and MLflow marks the run
    KILLED. A second Ctrl-C exits at once, saying which updates were not saved.

    \b
    Exit codes:
      0    finished (a stop condition, or surreal-redis stop)
      1    failed, or the launch was refused
      2    bad command-line usage
      130  interrupted (Ctrl-C or SIGTERM)"""
    from surreal_redis.launcher.preload import Preloaded

    # torch imports while the rest of the launch gets ready: started by the console script's entry
    # before click loaded (surreal_redis.cli.run; None when it could not start), else here
    learner = ctx.obj.pop("preloaded") if "preloaded" in ctx.obj else Preloaded.start("learner")
    try:
        from surreal_redis.launcher import Launcher, LaunchError

        extra = [f"agent.num_agents={agents}"] if agents is not None else []
        config = _load(config_path, tuple(overrides) + tuple(extra), redis_url or resolve_url(None))
        stop = StopFlag()
        try:
            launcher = Launcher(config, stop, resume=resume, resume_from=resume_from,
                                progress=lambda line: click.echo(line, err=True), log_level=ctx.obj["log_level"],
                                fresh=fresh, preloaded=learner)
            code = launcher.run()
            stop.finish()  # a Ctrl-C during the exit changes nothing now
        except (LaunchError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    finally:
        if learner is not None:
            learner.discard()  # unless the learner's first start took it over
    sys.exit(code)


@click.command()
@click.option("--id", "agent_id", type=click.IntRange(min=0), required=True, help="Agent id (shard = id mod shards).")
@config_option
@run_option
@url_option
@override_option
@_fail_cleanly
def agent(agent_id: int, config_path: str | None, run_name: str | None, redis_url: str | None,
          overrides: tuple[str, ...]) -> None:
    """Run one stateless agent of a run: --run NAME takes the config its launcher stored in Redis,
    --config FILE a config file (whose experiment.name is the run)."""
    if (config_path is None) == (run_name is None):
        # With neither, built-in defaults would wait forever for a run named 'default'.
        raise click.UsageError("agent needs --run NAME (the config its launcher stored in Redis) or --config FILE, "
                               "not " + ("both" if config_path else "neither"))
    _one_blas_thread()
    from surreal_redis.agent import Agent

    config = _load(config_path, overrides, redis_url, run_name)
    lower_priority(config.agent.nice)
    stop = StopFlag()
    client = _waiting_client(config, stop, f"agent {agent_id}")
    log.info("agent %d of run %r: waiting for its learner's first parameters", agent_id, config.run)
    agent_process = Agent(config, client, agent_id, stop)
    _single_threaded_torch()
    _exit_process(agent_process.run())


@click.command()
@config_option
@run_option
@url_option
@override_option
@resume_options
@click.option("--final-curves-by-launch", "launch_draws", is_flag=True, hidden=True,
              help="Leave the final curves.png to launch, whose final eval redraws it.")
@_fail_cleanly
def learner(config_path: str | None, run_name: str | None, redis_url: str | None, overrides: tuple[str, ...],
            resume: str | None, resume_from: Path | None, launch_draws: bool) -> None:
    """Run the learner (CUDA when available, else CPU)."""
    from surreal_redis.learner.loop import Learner

    config = _load(config_path, overrides, redis_url, run_name)
    stop = StopFlag()
    client = _waiting_client(config, stop, "learner")
    _exit_process(Learner.from_config(config, client, stop, resume=resume, resume_from=resume_from,
                                      final_draw=not launch_draws).run())


@click.command("eval")
@click.option("--mode", type=click.Choice(["deterministic", "stochastic"]), default=None,
              help="Eval policy mode (default: eval.mode of the config).")
@click.option("--id", "eval_id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--checkpoint", "checkpoint_path",
              type=click.Path(dir_okay=False, exists=True, allow_dash=True, path_type=Path),
              default=None, help="Score this checkpoint file once instead (launch's final eval): "
                                 "eval.final_episodes episodes within eval.final_max_s seconds, their mean entered "
                                 "among its folder's best-k; prints the result as JSON. Needs no Redis. '-': get "
                                 "ready, then read the file's path from stdin (nothing to do if stdin ends first).")
@config_option
@run_option
@url_option
@override_option
@_fail_cleanly
def eval_cmd(mode: str | None, eval_id: int, checkpoint_path: Path | None, config_path: str | None,
             run_name: str | None, redis_url: str | None, overrides: tuple[str, ...]) -> None:
    """Evaluate the latest parameters repeatedly; sends no experience."""
    _one_blas_thread()
    from surreal_redis.evaluator import Evaluator, score_checkpoint

    config = _load(config_path, overrides, redis_url, run_name)
    lower_priority(config.agent.nice)
    if checkpoint_path is not None:
        stop = StopFlag()
        if checkpoint_path == Path("-"):
            checkpoint_path = _checkpoint_when_told(config)
            if checkpoint_path is None:
                _exit_process(0)
        result = score_checkpoint(config, checkpoint_path, stop, mode)
        click.echo(json.dumps({**result._asdict(), "score": result.score}))
        _exit_process(0)
    stop = StopFlag()
    evaluator = Evaluator(config, _waiting_client(config, stop, f"eval {eval_id}"), stop, mode=mode, eval_id=eval_id)
    _single_threaded_torch()
    _exit_process(evaluator.run())


def _checkpoint_when_told(config: ExperimentConfig) -> Path | None:
    """``eval --checkpoint -``, which ``launch`` starts long before its final eval: build once what
    scoring a checkpoint builds (the env, the algorithm's trainer and policy: torch and the rest
    imported, seconds of CPU) in a thread at the lowest priority (:data:`STANDBY_NICE`), so it
    takes what the run leaves idle while the eval itself plays at this process's priority, then
    block until stdin gives the checkpoint's path. None when stdin ends first (no final eval is
    due). A path that is no file is a ``click.BadParameter``; a failed build is raised here."""
    failed: list[BaseException] = []

    def build() -> None:
        try:
            lower_thread_priority(STANDBY_NICE)
            from surreal_redis.algos.learning import make_trainer
            from surreal_redis.algos.policies import make_policy
            from surreal_redis.envs import make_env

            env = make_env(config.env, seed=config.experiment.seed, mode="eval")
            on_cpu = [f"{config.algo}.device=cpu"] if hasattr(config.algo_config, "device") else []
            make_trainer(config.with_overrides(on_cpu).algo_config, env.observation_space, env.action_space)
            make_policy(config.algo_config, env.observation_space, env.action_space, 1, agent_id=0,
                        num_agents=config.agent.num_agents, seed=config.experiment.seed,
                        inference=config.agent.inference)
            env.close()
        except BaseException as exc:  # raised in the main thread
            failed.append(exc)

    builder = threading.Thread(target=build, name="final-eval-build", daemon=True)
    builder.start()
    builder.join()
    if failed:
        raise failed[0]
    from surreal_redis.launcher.final_eval import STANDBY_READY

    log.info("final eval ready: waiting for the checkpoint's path on stdin")
    click.echo(STANDBY_READY)  # flushed: the launcher gives the path only to a standby that said so
    told = sys.stdin.readline().strip()
    if not told:
        return None
    path = Path(told)
    if not path.is_file():
        raise click.BadParameter(f"no checkpoint file at {told!r}", param_hint="the path read from stdin")
    return path
