"""Run state in Redis: control (stop requests, learner status, stored config, dropping a run),
agent heartbeats and episode statistics."""
