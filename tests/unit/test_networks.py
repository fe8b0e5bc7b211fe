"""Image observations of every shape get a CNN stem with 1/255 scaling and no z-filter; vectors
get flattened (and z-filtered); anything else is refused naming the leaf."""

from __future__ import annotations

import typing

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from surreal_redis.algos import networks
from surreal_redis.algos.ddpg.config import DDPGConfig
from surreal_redis.algos.network_config import ACTIVATION_NAMES
from surreal_redis.algos.networks import (
    EagerAdam,
    NatureCNN,
    ObservationEncoder,
    SmallCNN,
    adam,
    channels_first,
    clip_grad_norm,
    grad_norm,
    mlp,
)
from surreal_redis.algos.normalizer import ObservationNormalizer
from surreal_redis.algos.ppo.policy import ActorCritic, PPOConfig, PPOPolicy
from surreal_redis.algos.sac.config import SACConfig
from surreal_redis.envs.spaces import ImageLayout, image_layout


def box(*shape, dtype=np.uint8):
    return gym.spaces.Box(0, 255, shape, dtype) if dtype == np.uint8 else gym.spaces.Box(-1, 1, shape, dtype)


def frames(k, *shape):
    return gym.spaces.Tuple([box(*shape)] * k)


@pytest.mark.parametrize("space, layout", [
    (box(84, 84), ImageLayout(1, 84, 84, "hw")),
    (box(84, 84, 3), ImageLayout(3, 84, 84, "hwc")),
    (box(96, 96, 12), ImageLayout(12, 96, 96, "hwc")),
    (box(3, 64, 64), ImageLayout(3, 64, 64, "chw")),
    (box(4, 84, 84), ImageLayout(4, 84, 84, "chw")),
    (box(8, 8, 8), ImageLayout(8, 8, 8, "hwc")),
    (frames(4, 84, 84), ImageLayout(4, 84, 84, "hw")),
    (frames(3, 48, 48, 3), ImageLayout(9, 48, 48, "hwc")),
    (box(128), None),
    (box(84, 84, 3, dtype=np.float32), None),
    (gym.spaces.Tuple([box(8, 8), box(8, 9)]), None),
])
def test_image_layouts(space, layout):
    assert image_layout(space) == layout


@pytest.mark.parametrize("space, stem", [
    (box(84, 84), NatureCNN), (box(84, 84, 3), NatureCNN), (box(3, 64, 64), NatureCNN),
    (frames(4, 84, 84), NatureCNN), (frames(2, 48, 48, 3), NatureCNN),
    (box(16, 16), SmallCNN), (frames(2, 8, 8), SmallCNN), (box(3, 20, 30), SmallCNN),
])
def test_every_image_shape_gets_a_cnn(space, stem):
    encoder = ObservationEncoder(space)
    assert isinstance(encoder.stems["_"], stem) and encoder.out_dim == 512
    batch = torch.as_tensor(np.stack([space.sample() for _ in range(3)]) if isinstance(space, gym.spaces.Box)
                            else np.zeros(1))
    if isinstance(space, gym.spaces.Tuple):
        batch = tuple(torch.as_tensor(np.stack([s.sample() for _ in range(3)])) for s in space.spaces)
    assert encoder(batch).shape == (3, 512)


def test_axis_orders_agree_and_frames_stack_along_channels():
    torch.manual_seed(0)
    rgb = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8)
    last, first = ObservationEncoder(box(40, 40, 3)), ObservationEncoder(box(3, 40, 40))
    first.load_state_dict(last.state_dict())
    torch.testing.assert_close(last(rgb), first(rgb.permute(0, 3, 1, 2)))
    # a tuple of K grayscale frames is the same input as one (K, H, W) image
    gray = [torch.randint(0, 256, (2, 40, 40), dtype=torch.uint8) for _ in range(4)]
    stacked, separate = ObservationEncoder(box(4, 40, 40)), ObservationEncoder(frames(4, 40, 40))
    separate.load_state_dict(stacked.state_dict())
    torch.testing.assert_close(separate(tuple(gray)), stacked(torch.stack(gray, 1)))
    layout = image_layout(frames(2, 40, 40, 3))
    assert channels_first([rgb, rgb], layout).shape == (2, 6, 40, 40)


def test_pixels_are_scaled_by_1_over_255():
    stem = ObservationEncoder(box(36, 36)).stems["_"]
    white = torch.full((1, 1, 36, 36), 255, dtype=torch.uint8)
    torch.testing.assert_close(stem(white), stem.head(stem.conv(torch.ones(1, 1, 36, 36))))


def test_dict_mixes_a_cnn_for_images_with_vectors():
    space = gym.spaces.Dict({"camera": box(84, 84, 3), "state": box(7, dtype=np.float32),
                             "depth": box(84, 84)})
    encoder = ObservationEncoder(space)
    assert sorted(encoder.stems) == ["camera", "depth"] and encoder.out_dim == 512 + 512 + 7
    obs = {k: torch.as_tensor(np.stack([s.sample(), s.sample()])) for k, s in space.spaces.items()}
    assert encoder(obs).shape == (2, 1031)
    normalizer = ObservationNormalizer(space)
    assert list(normalizer.stats) == ["state"]  # images are never z-filtered
    out = normalizer(obs)
    assert out["camera"] is obs["camera"] and out["depth"] is obs["depth"]


@pytest.mark.parametrize("space", [box(84, 84), box(84, 84, 3), box(3, 64, 64), frames(4, 84, 84)])
def test_image_observations_are_never_z_filtered(space):
    assert len(ObservationNormalizer(space).stats) == 0
    net = ActorCritic(PPOConfig(normalize_obs=True), space, gym.spaces.Discrete(4))
    assert "_" in net.encoder.stems and len(net.obs_normalizer.stats) == 0


def test_grayscale_frame_without_stack_acts_through_the_cnn():
    policy = PPOPolicy(PPOConfig(normalize_obs=True), box(84, 84), gym.spaces.Discrete(6), num_envs=2, seed=0)
    assert isinstance(policy.net.encoder.stems["_"], NatureCNN)
    out = policy.act(np.random.default_rng(0).integers(0, 256, (2, 84, 84), dtype=np.uint8))
    assert out.actions.shape == (2,) and out.extras["logp"].shape == (2,)


@pytest.mark.parametrize("space, leaf", [
    (gym.spaces.Dict({"image": box(84, 84, 3), "mode": gym.spaces.Discrete(3)}), "observation leaf 'mode'"),
    (gym.spaces.Dict({"frames": gym.spaces.Tuple([box(8, 8), box(8, 9)])}), "observation leaf 'frames'"),
    (gym.spaces.MultiBinary(4), "the observation"),
    (gym.spaces.Dict({"nested": gym.spaces.Dict({"x": box(2, dtype=np.float32)})}), "observation leaf 'nested'"),
])
def test_unsupported_leaves_are_refused_by_name(space, leaf):
    with pytest.raises(ValueError, match=f"no network for {leaf}"):
        ActorCritic(PPOConfig(), space, gym.spaces.Discrete(2))


def test_fused_adam_takes_the_steps_of_torchs_loop():
    """:func:`adam` (fused) and ``torch.optim.Adam``'s default loop end at the same parameters,
    weight decay included, and their state dicts load into each other."""
    torch.manual_seed(0)
    nets = [mlp(4, (32, 32), 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    fused = adam(nets[0].parameters(), lr=1e-2, eps=1e-5, weight_decay=1e-3)
    loop = torch.optim.Adam(nets[1].parameters(), lr=1e-2, eps=1e-5, weight_decay=1e-3)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    x = torch.randn(64, 4)
    for _ in range(20):
        for net, optimizer in zip(nets, (fused, loop)):
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(nets[0][0].weight, mlp(4, (32, 32), 2)[0].weight)
    restored = adam(nets[1].parameters(), lr=1e-2)
    restored.load_state_dict(loop.state_dict())  # checkpoints written before the fused kernel load
    assert restored.state_dict()["state"][0]["exp_avg"].equal(loop.state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("scale", [1e-3, 1.0, 100.0], ids=["under", "near", "over"])
def test_clip_grad_norm_and_grad_norm_give_torchs_gradients_and_norm_to_the_bit(scale):
    """Under, near and over the limit; a parameter without a gradient is left alone, as torch does."""
    torch.manual_seed(0)
    nets = [mlp(4, (64, 64), 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    extra = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]  # no gradient
    x = torch.randn(256, 4)
    for net in nets:
        (scale * net(x).pow(2).mean()).backward()
    ours = clip_grad_norm([*nets[0].parameters(), extra[0]], 0.5)
    theirs = torch.nn.utils.clip_grad_norm_([*nets[1].parameters(), extra[1]], 0.5)
    assert torch.equal(ours, theirs)
    assert torch.equal(grad_norm(list(nets[0].parameters())),
                       torch.nn.utils.get_total_norm([p.grad for p in nets[0].parameters()]))
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a.grad, b.grad)
    assert extra[0].grad is None
    assert clip_grad_norm([extra[0]], 0.5).item() == 0.0


@pytest.mark.parametrize("config_class", [PPOConfig, DDPGConfig, SACConfig])
def test_every_configs_activation_literal_names_the_networks_activations(config_class):
    """The sections type ``activation`` as a Literal (shown in the config reference); the
    networks build from :data:`ACTIVATION_NAMES`: both must name the same activations."""
    hint = typing.get_type_hints(config_class)["activation"]
    assert typing.get_origin(hint) is typing.Literal and set(typing.get_args(hint)) == set(ACTIVATION_NAMES)


def test_eager_adam_makes_torch_adams_updates_and_state():
    """networks.adam (EagerAdam, which skips torch's dynamo wrappers) updates as torch's fused
    Adam does, bit for bit, with the learning rate changed in between (PPO's annealing), and
    their state dicts load into each other."""
    torch.manual_seed(0)
    ours_net, theirs_net = mlp(4, [8], 2), mlp(4, [8], 2)
    theirs_net.load_state_dict(ours_net.state_dict())
    ours = adam(ours_net.parameters(), lr=1e-2, eps=1e-5)
    theirs = torch.optim.Adam(theirs_net.parameters(), lr=1e-2, eps=1e-5, weight_decay=0.0, fused=True)
    for step in range(4):
        x = torch.randn(16, 4)
        for net, opt in ((ours_net, ours), (theirs_net, theirs)):
            opt.param_groups[0]["lr"] = 1e-2 / (step + 1)
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(ours_net.parameters(), theirs_net.parameters()):
        assert torch.equal(a, b)
    assert str(ours.state_dict()) == str(theirs.state_dict())
    again = torch.optim.Adam(theirs_net.parameters(), lr=1.0, fused=True)
    again.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert str(again.state_dict()) == str(ours.state_dict())


def test_adam_keeps_its_own_capturable_when_loading_a_checkpoint():
    """adam() makes CUDA optimizers ``capturable`` (step count on the device) and CPU ones not; a
    checkpoint saved on the other kind of device loads without changing that choice."""
    net = mlp(4, [8], 2)
    opt = adam(net.parameters(), lr=1e-2)
    assert opt.param_groups[0]["capturable"] is False and opt.param_groups[0]["fused"] is True
    net(torch.randn(3, 4)).sum().backward()
    opt.step()
    state = opt.state_dict()
    state["param_groups"][0]["capturable"] = True  # as a CUDA learner saves it
    again = adam(net.parameters(), lr=1e-2)
    again.load_state_dict(state)
    assert again.param_groups[0]["capturable"] is False
    again.step()


def test_eager_adam_short_step_is_torchs_fused_step_and_falls_back_when_it_cannot_be(monkeypatch):
    """Once every parameter has state, adam()'s step makes torch's fused-Adam kernel calls itself
    (no list gathering and grouping in Python): the same parameters and state bit for bit, weight
    decay and a changed learning rate included. A step with a parameter left without a gradient,
    and the first step (no state yet), go through torch's own step; so does a step after the
    state was loaded from a checkpoint (new state tensors) only if it must."""
    torch.manual_seed(0)
    nets = [mlp(4, [8], 2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    extras = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    ours = adam([*nets[0].parameters(), extras[0]], lr=1e-2, eps=1e-5, weight_decay=1e-3)
    theirs = torch.optim.Adam([*nets[1].parameters(), extras[1]], lr=1e-2, eps=1e-5, weight_decay=1e-3, fused=True)
    torch_steps: list[int] = []
    init_group = torch.optim.Adam._init_group

    def counted(self, *args, **kwargs):
        if self is ours:
            torch_steps.append(step)
        return init_group(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "_init_group", counted)
    for step in range(7):
        x = torch.randn(16, 4)
        for net, extra, optimizer in ((nets[0], extras[0], ours), (nets[1], extras[1], theirs)):
            optimizer.param_groups[0]["lr"] = 1e-2 / (step + 1)
            optimizer.zero_grad()
            loss = net(x).pow(2).mean() + (0.0 if step == 3 else extra.pow(2).sum())  # step 3: no gradient
            loss.backward()
            optimizer.step()
        if step == 4:
            ours.load_state_dict(ours.state_dict())
        for a, b in zip([*nets[0].parameters(), extras[0]], [*nets[1].parameters(), extras[1]]):
            assert torch.equal(a, b), step
    assert torch_steps == [0, 3]
    assert str(ours.state_dict()) == str(theirs.state_dict())


@pytest.mark.parametrize("dynamo_loaded", [False, True])
def test_eager_adam_step_skips_torchs_hook_wrapper_until_a_hook_or_the_profiler_asks_for_it(monkeypatch,
                                                                                          dynamo_loaded):
    """torch wraps an optimizer's ``step`` in a profiler range and its step hooks; adam()'s step is
    not wrapped, and applies that wrapper itself when it matters: this optimizer's pre- and
    post-step hooks and the global ones run once per step (also through torch's own step once
    dynamo is loaded), and the profiler sees the step's range, as for torch's Adam."""
    monkeypatch.setattr(networks, "_dynamo_loaded", lambda: dynamo_loaded)
    assert not hasattr(EagerAdam.step, "__wrapped__")
    net = mlp(4, [8], 2)
    optimizer = adam(net.parameters(), lr=1e-2)
    plain = torch.optim.Adam(mlp(4, [8], 2).parameters(), lr=1e-2)  # wraps torch's Adam.step: not ours
    assert hasattr(torch.optim.Adam.step, "__wrapped__") and plain is not None
    calls: list[str] = []
    hooks = [optimizer.register_step_pre_hook(lambda *_: calls.append("pre")),
             optimizer.register_step_post_hook(lambda *_: calls.append("post")),
             register_optimizer_step_pre_hook(lambda *_: calls.append("global pre")),
             register_optimizer_step_post_hook(lambda *_: calls.append("global post"))]
    for _ in range(2):  # torch's step (no state yet), then the short one
        optimizer.zero_grad()
        net(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    assert calls == ["global pre", "pre", "post", "global post"] * 2
    for hook in hooks:
        hook.remove()
    before = [p.detach().clone() for p in net.parameters()]
    optimizer.zero_grad()
    net(torch.randn(3, 4)).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.step()
    assert calls == ["global pre", "pre", "post", "global post"] * 2
    assert "Optimizer.step#EagerAdam.step" in {event.name for event in profile.events()}
    assert not any(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_in_place_relu_gives_the_out_of_place_outputs_and_gradients():
    """ReLU runs in place on its Linear's output: the forward and every gradient are those of
    the out-of-place module, bit for bit."""
    torch.manual_seed(0)
    ours = mlp(5, (32, 32), 3, activation="relu")
    plain = torch.nn.Sequential(*[torch.nn.ReLU() if isinstance(m, torch.nn.ReLU) else m
                                  for m in mlp(5, (32, 32), 3, "relu")])
    plain.load_state_dict(ours.state_dict())
    assert any(getattr(m, "inplace", False) for m in ours) and not any(getattr(m, "inplace", False) for m in plain)
    x = torch.randn(64, 5, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    out, expected = ours(x), plain(y)
    assert torch.equal(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert torch.equal(x.grad, y.grad)
    for a, b in zip(ours.parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad)
