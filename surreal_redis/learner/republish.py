"""Re-publishing a parameter version agents reject (digest mismatch: the live blob was damaged
in Redis), as a version above every one seen, so agents fetch a fresh, whole blob instead of
retrying the damaged one forever."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from surreal_redis.hub.run.heartbeat import AgentStatus

log = logging.getLogger(__name__)


class RejectionWatch:
    """Looks at the rejection counts in the agents' heartbeats at most once per ``every_s`` seconds
    (one HGETALL through ``read_agents``, live agents only) and has ``republish(above)`` publish the
    parameters as a version above ``above`` (it returns that version) when they rose under the same
    live version. Blocks only for that read and the republish."""

    def __init__(self, read_agents: Callable[[], Sequence[AgentStatus]], republish: Callable[[int], int],
                 every_s: float) -> None:
        self._read_agents, self._republish, self._every_s = read_agents, republish, every_s
        self._rejections: dict[tuple[str, int], int] = {}  # (agent id, pid) -> parameter downloads rejected
        self._rejections_version = -1  # the version live when they were last read
        self._next_check = 0.0  # time.monotonic() of the next look
        self.republished = 0  # versions republished because agents rejected the live one

    def look(self, live_version: int) -> bool:
        """Republish when due and the counts rose while ``live_version`` (the learner's last
        published) stayed live since the previous look; True when it republished."""
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + self._every_s
        agents = self._read_agents()
        rose = False
        for agent in agents:
            key = (agent.agent_id, agent.pid)
            rose |= agent.param_rejections > self._rejections.get(key, 0)
            self._rejections[key] = agent.param_rejections
        unchanged, self._rejections_version = self._rejections_version == live_version, live_version
        if not (rose and unchanged):
            return False
        version = self._republish(max([live_version, *(agent.param_version for agent in agents)]))
        self.republished += 1
        log.warning("agents rejected parameter v%d (damaged in Redis?); republished as v%d", live_version, version)
        self._rejections_version = -1  # the next look only takes counts reported before agents saw it
        return True
