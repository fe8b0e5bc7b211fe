"""PPO's minibatch step on its short paths: the log-probs and entropy without a distribution
object, the whole batch without a shuffle, and the report-only ops left to the last epoch."""

from __future__ import annotations

import pytest
import torch

from surreal_redis.algos.ppo.rollout import _merge_steps

from .test_ppo import setup


@pytest.mark.parametrize("name", ["discrete", "continuous_adapt"])
@pytest.mark.parametrize("grad", [True, False])
def test_log_prob_entropy_are_the_distributions(name, grad):
    """``ActorCritic.log_prob_entropy``: the distribution's log-probs and mean entropy (the
    Categorical's to float rounding, through ``log_softmax``); gradients reach the head through
    the log-probs, and through the entropy only with ``grad``."""
    algo, _, collector = setup(name)
    net = algo.net
    chunks = collector.collect(8)
    obs = torch.as_tensor(chunks[0].obs[:-1], dtype=torch.float32)  # obs[T] has no action
    key = "raw_action" if net.continuous else None
    actions = torch.as_tensor(chunks[0].extras[key] if key else chunks[0].actions)
    head = net.policy_head(net.features(obs)) * 3.0  # sharper logits than at initialization
    dist = net.distribution(head, validate=False)
    logp, entropy = net.log_prob_entropy(head, actions, grad=grad)
    torch.testing.assert_close(logp, dist.log_prob(actions), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy, dist.entropy().mean(), rtol=1e-6, atol=1e-6)
    assert logp.requires_grad and entropy.requires_grad == grad


def test_an_update_with_its_report_only_ops_in_every_epoch_trains_the_same_weights(monkeypatch):
    """The approx_kl and clip-fraction ops run in the last epoch only (without ``target_kl``):
    an update that runs them in every epoch ends at the same weights, bit for bit, and reports
    the same stats."""
    results = []
    for every_epoch in (False, True):
        algo, _, collector = setup("discrete", update_epochs=3, num_minibatches=2)
        chunks = collector.collect(12)
        if every_epoch:
            step = algo._minibatch_step
            monkeypatch.setattr(algo, "_minibatch_step", lambda *args, step=step: step(*args[:4], True))
        results.append((algo.update(chunks), [p.detach().clone() for p in algo.net.parameters()]))
    (stats, weights), (stats_every, weights_every) = results
    assert stats == stats_every
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_every))


def test_one_minibatch_of_the_whole_batch_is_the_shuffled_ones_step():
    """With one minibatch the rollout goes through the step as it is, unshuffled: the same
    gradient step, to float rounding, as on the rollout in a shuffled order."""
    algo, _, collector = setup("discrete", update_epochs=1, num_minibatches=1)
    chunks = collector.collect(12)
    rollout = _merge_steps([algo._rollout(chunks)])
    batch = rollout.logp.shape[1]
    shuffled = rollout.select(torch.randperm(batch, generator=torch.Generator().manual_seed(3)))
    state = {k: v.clone() for k, v in algo.net.state_dict().items()}
    optimizer_state = algo.optimizer.state_dict()
    weights = []
    for data in (rollout, shuffled):
        algo.net.load_state_dict(state)
        algo.optimizer.load_state_dict(optimizer_state)
        algo._minibatch_step(data, torch.arange(batch), None, (0.2, 0.0))
        weights.append([p.detach().clone() for p in algo.net.parameters()])
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(weights[0][0], state["actor.0.weight"])
