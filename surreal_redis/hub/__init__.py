"""The Redis data plane, in the order data flows: ``experience/`` (agents -> streams -> learner),
``params`` (learner -> agents), ``run/`` (control, heartbeats, episode statistics)."""
