"""The scale benchmark: N simulated agents on one hub, with a real learner-side reader and publisher.

:func:`~harness.scale.case.run_case` measures one :class:`~harness.scale.spec.CaseSpec`: a fresh hub
(one primary; or a primary with read replicas for the parameters; or a Redis Cluster of 3
primaries), then

- ``workers`` agent processes holding the N agents as threads. Each simulated agent is what an
  agent process is to the hub: its own connection (plus one per read replica, as
  ``redis.param_read_urls`` gives an agent), its own
  :class:`~surreal_redis.hub.experience.sender.ExperienceSender` (its own uuid) and
  :class:`~surreal_redis.hub.params.ParameterClient`, and in lockstep its own
  :class:`~surreal_redis.hub.quota.ProductionQuota` claims and :class:`~surreal_redis.hub.quota.QuotaNews`
  subscription. It replays a recorded trajectory (:mod:`harness.bench_data`: Pong-like
  4-frame stacks, each frame marked with the agent and the pass so that frames are new bytes per
  agent and dedup stays what it is within one agent's stream; HalfCheetah-like 17-float vectors)
  through ``sender.add`` at the per-agent rate of a real agent of that env
  (:data:`~harness.scale.spec.PROFILES`), polls the parameter version every ``fetch_every_steps``
  vector steps (free production) or claims every flush (lockstep), and downloads every new
  version (with ``BroadcastOptions.min_version_lag``, the client's ``min_version_lag``: only one
  that many publishes ahead);
- one learner-side process: :class:`~surreal_redis.hub.experience.receiver.ExperienceReceiver`
  moving the inboxes, reading, decoding and acking (what the learner's prefetch thread and feed do),
  plus the :class:`~surreal_redis.hub.experience.retention.HubJanitor` every 5 s;
- one publisher process: :class:`~surreal_redis.hub.params.ParameterPublisher` with the real
  network's parameters (PPO's Nature CNN for Pong, 6.75 MB of float32; the 256x256 MLPs for
  HalfCheetah, 0.57 MB), every ``publish_every_s`` (and a grant after each in lockstep);
- one probe process polling the version and PINGing the primary 50 times a second from a quiet
  process: the latency Redis itself adds, apart from the agents' CPU contention.

Timeline: setup (agents connect and download v1), ``warmup_s``, phase A (``quiet_s``: experience
and version polls, no publishes), phase B (``loaded_s``: publishes too), then every agent flushes
and the reader drains. Phase A gives Redis CPU per transition; phase B's CPU beyond that rate is
what the parameter downloads cost (per GB, and as a share of the primary's CPU).

Everything is measured, nothing asserted; everything shares this machine's cores, so "produced"
(what the agents managed) can fall short of "offered" (N x the per-agent rate) because the client
side runs out of CPU before Redis does: the results say which.

Modules: :mod:`~harness.scale.spec` (cases and plans), :mod:`~harness.scale.params` (the real
networks' parameters), :mod:`~harness.scale.servers` (servers and readings),
:mod:`~harness.scale.agents` and :mod:`~harness.scale.workers` (the simulated agents and their
processes), :mod:`~harness.scale.processes` (reader, publisher, probe), :mod:`~harness.scale.case`
(one case's timeline), :mod:`~harness.scale.summary` (its results and capacity),
:mod:`~harness.scale.run` (the whole plan) and :mod:`~harness.scale.report` (figure and tables).
"""

from .case import run_case
from .params import fp16_logit_check, load_params, real_params, trained_pong_params
from .report import markdown_tables, scale_figure
from .run import broadcast_summary, run_scale_bench
from .spec import PROFILES, BenchPlan, BroadcastOptions, CaseSpec, EnvProfile
from .summary import capacity, version_ages

__all__ = ["PROFILES", "BenchPlan", "BroadcastOptions", "CaseSpec", "EnvProfile", "broadcast_summary", "capacity",
           "fp16_logit_check", "load_params", "markdown_tables", "real_params", "run_case", "run_scale_bench",
           "scale_figure", "trained_pong_params", "version_ages"]
