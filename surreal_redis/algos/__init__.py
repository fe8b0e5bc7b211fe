"""Learning algorithms (PPO, DDPG), their networks and agent-side policies."""
