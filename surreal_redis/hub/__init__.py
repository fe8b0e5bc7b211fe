"""The Redis data plane, in the order data flows: ``experience/`` (agents -> streams -> learner),
``params`` (learner -> agents), ``quota`` (lockstep grants and claims), ``channel`` (confirmed
subscriptions: parameter news, read announcements), ``run/`` (control, heartbeats, episode
statistics)."""
