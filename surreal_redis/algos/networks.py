"""Network building blocks shared by the torch algorithms: MLP torsos, CNN pixel stems, an
observation encoder, and the moves between numpy and torch (devices, observation trees, parameter
dicts).

Images (see :mod:`surreal_redis.envs.spaces`) go through a CNN stem, scaled by 1/255 (never
z-filtered); a frame tuple of K frames of C channels is one ``[B, K*C, H, W]`` input. Every other
Box leaf is flattened.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.optim import optimizer as optimizer_module

from surreal_redis.algos.network_config import NATURE_MIN_SIZE
from surreal_redis.codec import ParamDict, Tree
from surreal_redis.envs.spaces import ImageLayout, image_layout, is_frame_tuple, is_image_space
from surreal_redis.trees import tree_map

__all__ = ["ACTIVATIONS", "NATURE_MIN_SIZE", "NatureCNN", "ObservationEncoder", "QNetwork", "SmallCNN", "actor_params",
           "channels_first", "is_frame_tuple", "is_image_space", "layer_init", "load_actor_params",
           "load_module_params", "mlp", "module_params", "normalized_obs", "obs_to_tensor", "params_as_tensors",
           "pixel_stem", "resolve_device", "soft_update", "TargetAverager"]

# ReLU in place: it overwrites its Linear's fresh output, which nothing else reads (its backward
# reads its result), saving an allocation and a pass: DDPG's update at [400, 300] takes 4% less
# time, bit-identical. ELU's in-place backward rounds differently; nn.Tanh has no in-place form.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"tanh": nn.Tanh, "relu": partial(nn.ReLU, inplace=True),
                                                   "elu": nn.ELU}


def params_as_tensors(params: ParamDict, prefix: str = "") -> dict[str, torch.Tensor]:
    """The entries of ``params`` under ``prefix`` (stripped) as CPU tensors sharing their memory,
    for ``load_state_dict``, which copies them into the module's own parameters. Arrays fetched
    from the hub are read-only views of the downloaded blob; torch's warning about that is moot
    here because nothing writes through these tensors."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {name[len(prefix):]: torch.from_numpy(np.asarray(value))
                for name, value in params.items() if name.startswith(prefix)}


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else as torch understands it."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def obs_to_tensor(obs: Tree, device: torch.device | str) -> Tree:
    """numpy observation tree -> tensors on ``device`` (floats as float32, other dtypes kept)."""
    def convert(x: np.ndarray) -> torch.Tensor:
        x = np.asarray(x)
        return torch.as_tensor(x.astype(np.float32, copy=False) if x.dtype.kind == "f" else x, device=device)
    return tree_map(convert, obs)


def module_params(prefix: str, module: nn.Module) -> ParamDict:
    """``module``'s state as CPU numpy arrays, keys ``prefix + name``."""
    return {prefix + name: value.detach().cpu().numpy().copy() for name, value in module.state_dict().items()}


def load_module_params(module: nn.Module, prefix: str, params: ParamDict) -> None:
    """Inverse of :func:`module_params` (strict: every key of ``module`` must be present)."""
    module.load_state_dict(params_as_tensors(params, prefix))


def actor_params(actor: nn.Module, obs_normalizer: nn.Module | None) -> ParamDict:
    """What agents of an actor-critic algorithm load: the actor's state (``actor.*``) and, with a
    z-filter, its statistics (``obs_normalizer.*``)."""
    params = module_params("actor.", actor)
    if obs_normalizer is not None:
        params.update(module_params("obs_normalizer.", obs_normalizer))
    return params


def load_actor_params(actor: nn.Module, obs_normalizer: nn.Module | None, params: ParamDict) -> None:
    """Inverse of :func:`actor_params`."""
    load_module_params(actor, "actor.", params)
    if obs_normalizer is not None:
        load_module_params(obs_normalizer, "obs_normalizer.", params)


def normalized_obs(obs: Tree, device: torch.device, obs_normalizer: nn.Module | None) -> Tree:
    """A numpy observation tree as tensors on ``device`` (:func:`obs_to_tensor`), through the
    z-filter when there is one."""
    x = obs_to_tensor(obs, device)
    return obs_normalizer(x) if obs_normalizer is not None else x


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """Polyak averaging of target networks ``target <- (1 - tau) target + tau online``; buffers are copied."""
    for target_param, param in zip(target.parameters(), online.parameters()):
        target_param.lerp_(param, tau)
    for target_buffer, buffer in zip(target.buffers(), online.buffers()):
        target_buffer.copy_(buffer)


class TargetAverager:
    """:func:`soft_update` of one or more (target, online) module pairs of identical structure as
    one in-place ``torch._foreach_lerp_`` over all their parameters (the same arithmetic as
    ``lerp_`` per tensor) and one ``_foreach_copy_`` of their buffers, on tensor lists gathered
    once. The lists stay valid while the modules keep their tensors (``load_state_dict`` copies
    into them); rebuild the averager after ``.to()`` or anything else that replaces them."""

    def __init__(self, *pairs: tuple[nn.Module, nn.Module]) -> None:
        self.targets: list[torch.Tensor] = [p for target, _ in pairs for p in target.parameters()]
        self.onlines: list[torch.Tensor] = [p for _, online in pairs for p in online.parameters()]
        self.target_buffers = [b for target, _ in pairs for b in target.buffers()]
        self.online_buffers = [b for _, online in pairs for b in online.buffers()]
        if len(self.targets) != len(self.onlines) or len(self.target_buffers) != len(self.online_buffers):
            raise ValueError("a target and its online module differ in their parameters or buffers")

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        """``target <- (1 - tau) target + tau online`` for every parameter; buffers copied."""
        torch._foreach_lerp_(self.targets, self.onlines, tau)
        if self.target_buffers:
            torch._foreach_copy_(self.target_buffers, self.online_buffers)


Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)


def _dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


class EagerAdam(torch.optim.Adam):
    """``torch.optim.Adam`` that leaves ``torch._dynamo`` unimported (~1 s of CPU, a quarter of a
    learner's start, and as much of a final eval's) while nothing else imported it.

    torch wraps ``step``, ``zero_grad``, ``add_param_group``, ``state_dict`` and
    ``load_state_dict`` so that ``torch.compile`` does not trace them, and each wrapper imports
    dynamo on its first call; outside ``torch.compile`` a wrapper only calls the method it wraps.
    Here those methods call the wrapped method directly (``inspect.unwrap``; ``step`` with grad
    off, as its wrapper does) until dynamo is loaded by anyone, then torch's wrappers: the same
    update and the same state dict as ``torch.optim.Adam``, whose checkpoints load either way.
    """

    def step(self, closure: Any = None) -> Any:
        if self._observed():
            return torch.optim.Optimizer.profile_hook_step(EagerAdam._step)(self, closure)
        return self._step(closure)

    # torch wraps every optimizer class's ``step`` in a profiler range and its step hooks unless
    # the method says it is wrapped already: ~40 us a call, a tenth of a small network's step.
    # This step applies that wrapper itself when a step hook is registered or a profiler runs.
    step.hooked = True  # type: ignore[attr-defined]

    def _observed(self) -> bool:
        """A step hook is registered (this optimizer's or a global one) or the autograd profiler runs."""
        return bool(self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                    or optimizer_module._global_optimizer_pre_hooks or optimizer_module._global_optimizer_post_hooks
                    or torch.autograd._profiler_enabled())

    def _step(self, closure: Any = None) -> Any:
        if closure is None and self._fused_step():
            return None
        if _dynamo_loaded():
            step: Any = torch.optim.Adam.step  # without the hook wrapper a plain Adam put on it: applied above
            return (step.__wrapped__ if getattr(step, "hooked", False) else step)(self, closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return inspect.unwrap(torch.optim.Adam.step)(self, closure)

    def _fused_step(self) -> bool:
        """The step of torch's fused Adam for one group of parameters that all have gradients and
        state (every step after the first), on one device and dtype: its two kernel calls
        (``_foreach_add_`` of the step counts, ``_fused_adam_``), without the ~0.15 ms of Python
        that ``Adam.step`` spends around them on a small network (gathering the lists, grouping
        them by device, checks). False (nothing done) when that is not the case: torch's step then."""
        if len(self.param_groups) != 1:
            return False
        group = self.param_groups[0]
        if not group["fused"] or group["amsgrad"] or group["maximize"] or group["decoupled_weight_decay"]:
            return False
        params = group["params"]
        states = [self.state.get(param) or {} for param in params]  # {}: no state yet
        if not all(states) or any(param.grad is None for param in params):
            return False
        first = params[0]
        if any(param.device != first.device or param.dtype != first.dtype for param in params):
            return False
        steps = [state["step"] for state in states]
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, [param.grad for param in params], [state["exp_avg"] for state in states],
                           [state["exp_avg_sq"] for state in states], [], steps, amsgrad=False, lr=group["lr"],
                           beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                           maximize=False, grad_scale=None, found_inf=None)
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        _eager(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _eager(torch.optim.Optimizer.add_param_group)(self, param_group)

    def state_dict(self) -> dict[str, Any]:
        return _eager(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads ``state_dict`` but keeps this optimizer's ``capturable`` (the device's choice,
        :func:`adam`): a CPU learner's checkpoint resumes capturable on CUDA, and back."""
        capturable = [group["capturable"] for group in self.param_groups]
        _eager(torch.optim.Optimizer.load_state_dict)(self, state_dict)
        for group, keep in zip(self.param_groups, capturable):
            group["capturable"] = keep


def _eager(method: Any) -> Any:
    """``method`` as torch defines it (dynamo loaded), else the function its wrappers call."""
    return method if _dynamo_loaded() else inspect.unwrap(method)


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
         betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Adam:
    """Adam with torch's fused kernel (all parameters in one kernel, on CPU and CUDA): the update of
    torch's default per-tensor loop, up to float rounding, at a lower cost per step. Without
    importing ``torch._dynamo`` (:class:`EagerAdam`). On CUDA also ``capturable`` (its step count
    on the device: no host sync, and the step may run inside a CUDA graph)."""
    params = list(params)
    capturable = any(param.is_cuda for param in params)
    return EagerAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True,
                     capturable=capturable)


def _norm_of(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the per-tensor 2-norms of ``grads`` (0 for none), a 0-d tensor."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros(())


@torch.no_grad()
def grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of the gradients of ``params`` (one device and dtype: a network's), as
    ``torch.nn.utils.get_total_norm`` takes it (the 2-norm of the per-tensor norms), without its
    regrouping of the tensors by device on every call; a 0-d tensor, not read (no host sync)."""
    return _norm_of([param.grad for param in params if param.grad is not None])


@torch.no_grad()
def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters on one device and of one dtype (a
    network's): the same arithmetic (:func:`grad_norm`, then every gradient times
    ``min(max_norm / (norm + 1e-6), 1)``) at about half its cost (~80 against ~150 us for PPO's
    CartPole network on CPU, a tenth of a minibatch step). Returns the norm before clipping."""
    grads = [param.grad for param in params if param.grad is not None]
    total = _norm_of(grads)
    if grads:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def layer_init(layer: Layer, std: float = float(np.sqrt(2)), bias: float = 0.0) -> Layer:
    """Orthogonal weights, constant bias (CleanRL / baselines convention)."""
    nn.init.orthogonal_(layer.weight, std)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int | None = None, activation: str = "tanh",
        out_std: float = 1.0, norm: Callable[[int], nn.Module] | None = None) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` with orthogonal init; no activation after the output.
    ``norm``: a layer of the given width before every Linear, on the input and after each hidden
    activation (CrossQ's BatchNorm); None: none."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
    layers: list[nn.Module] = []
    last = in_dim
    for size in hidden:
        layers += [*([norm(last)] if norm else []), layer_init(nn.Linear(last, size)), ACTIVATIONS[activation]()]
        last = size
    if out_dim is not None:
        layers += [*([norm(last)] if norm else []), layer_init(nn.Linear(last, out_dim), std=out_std)]
    return nn.Sequential(*layers)


class _ConvStem(nn.Module):
    """Convolutions -> flatten -> Linear -> ReLU; input uint8 ``[B, C, H, W]`` scaled by 1/255."""

    def __init__(self, conv: nn.Sequential, in_channels: int, height: int, width: int, features: int) -> None:
        super().__init__()
        self.conv = conv
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, in_channels, height, width)).shape[1]
        self.head = nn.Sequential(layer_init(nn.Linear(flat, features)), nn.ReLU())
        self.out_dim = features

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(frames.float() / 255.0))


class NatureCNN(_ConvStem):
    """The DQN Nature CNN (as in CleanRL's ``ppo_atari.py``) for ``[B, C, H, W]`` frames with
    H, W >= 36 (84x84 Atari) -> ``[B, 512]``."""

    def __init__(self, in_channels: int, height: int, width: int, features: int = 512) -> None:
        conv = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
        )
        super().__init__(conv, in_channels, height, width, features)


class SmallCNN(_ConvStem):
    """Two padded 3x3 convolutions of stride 2 for frames smaller than the Nature CNN accepts
    (any H, W >= 1) -> ``[B, features]``."""

    def __init__(self, in_channels: int, height: int, width: int, features: int = 512) -> None:
        conv = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 3, stride=2, padding=1)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 3, stride=2, padding=1)), nn.ReLU(), nn.Flatten(),
        )
        super().__init__(conv, in_channels, height, width, features)


def pixel_stem(layout: ImageLayout) -> _ConvStem:
    """The Nature CNN for frames of at least 36x36, else :class:`SmallCNN`."""
    cls = NatureCNN if min(layout.height, layout.width) >= NATURE_MIN_SIZE else SmallCNN
    return cls(layout.channels, layout.height, layout.width)


def channels_first(frames: torch.Tensor | Sequence[torch.Tensor], layout: ImageLayout) -> torch.Tensor:
    """An image batch (``[B, H, W]``, ``[B, H, W, C]`` or ``[B, C, H, W]`` per ``layout.axes``),
    or a sequence of K such frame batches, as one ``[B, K*C, H, W]`` tensor."""
    if not isinstance(frames, torch.Tensor):
        return torch.cat([channels_first(frame, layout) for frame in frames], dim=1)
    if layout.axes == "hw":
        return frames.unsqueeze(1)
    if layout.axes == "hwc":
        return frames.permute(0, 3, 1, 2)
    return frames


class ObservationEncoder(nn.Module):
    """Maps an observation batch (tensor, tuple of frame tensors, or dict of those for Dict
    spaces) to ``[B, out_dim]``: a CNN stem (:func:`pixel_stem`) per image or frame-tuple leaf,
    vector leaves flattened (normalize them first), all concatenated in sorted key order. Raises
    ValueError naming the leaf for anything else (Discrete, nested Dict, unequal frames, ...).
    """

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        leaves = dict(sorted(space.spaces.items())) if isinstance(space, gym.spaces.Dict) else {"": space}
        self.keys = list(leaves)
        self.is_dict = isinstance(space, gym.spaces.Dict)
        self.stems = nn.ModuleDict()
        self.layouts: dict[str, ImageLayout] = {}
        self.out_dim = 0
        for key, leaf in leaves.items():
            name = key or "_"
            layout = image_layout(leaf)
            if layout is not None:
                self.layouts[name] = layout
                stem = self.stems[name] = pixel_stem(layout)
                self.out_dim += stem.out_dim
            elif isinstance(leaf, gym.spaces.Box):
                self.out_dim += int(np.prod(leaf.shape))
            else:
                where = f"observation leaf {key!r}" if key else "the observation"
                raise ValueError(f"no network for {where}: {leaf} (supported: Box vectors, uint8 images "
                                 "(H, W), (H, W, C) or (C, H, W), Tuples of identical uint8 frames, and a Dict "
                                 "of those)")

    def forward(self, obs: torch.Tensor | tuple | Mapping[str, torch.Tensor | tuple]) -> torch.Tensor:
        parts = []
        for key in self.keys:
            value = self._leaf(obs, key)
            name = key or "_"
            if name in self.stems:
                parts.append(self.stems[name](channels_first(value, self.layouts[name])))
            elif isinstance(value, torch.Tensor):
                parts.append(value.float().reshape(value.shape[0], -1))
            else:
                raise TypeError(f"observation leaf {key!r} is a vector leaf, got a {type(value).__name__}")
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _leaf(self, obs: torch.Tensor | tuple | Mapping[str, torch.Tensor | tuple],
              key: str) -> torch.Tensor | tuple:
        """Leaf ``key`` of a Dict space's observation, or the whole observation of any other."""
        if isinstance(obs, Mapping) != self.is_dict:
            raise TypeError(f"a {'Dict' if self.is_dict else 'non-Dict'} space's encoder got a {type(obs).__name__}")
        return obs[key] if isinstance(obs, Mapping) else obs


class QNetwork(nn.Module):
    """``Q(s, a)``: an MLP on the features of observations (leaves ``[B, ...]``, normalized) and on
    actions ``[B, A]`` -> ``[B]`` (DDPG's critic, each of SAC's and CrossQ's twins; ``norm`` as
    :func:`mlp`'s)."""

    def __init__(self, obs_space: gym.Space, action_dim: int, hidden: Sequence[int], activation: str,
                 out_std: float = 1.0, norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.encoder = ObservationEncoder(obs_space)
        self.mlp = mlp(self.encoder.out_dim + action_dim, hidden, 1, activation, out_std=out_std, norm=norm)

    def forward(self, obs: Tree, actions: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.encoder(obs), actions.float()], dim=-1)).squeeze(-1)
