"""Learning algorithms, each declared once by an :class:`~surreal_redis.algos.spec.AlgorithmSpec`
(built in: PPO, APPO, DDPG, SAC; more from plug-ins, see :mod:`surreal_redis.algos.registry`), their
networks, learner-side trainers and agent-side policies."""
