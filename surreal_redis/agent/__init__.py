"""The agent process (``surreal-redis agent --id K``): :mod:`.loop` steps the envs and sends
experience, :mod:`.claims` claims each flush from the learner's quota on grants, :mod:`.warmup`
acts at random for an off-policy agent's first steps."""

from surreal_redis.agent.loop import Agent, with_final_rows

__all__ = ["Agent", "with_final_rows"]
