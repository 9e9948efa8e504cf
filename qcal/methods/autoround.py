"""AutoRound (SignRound): per decoder block, rounding offsets and clipping factors learned
by signed gradient descent on the block's output error (the tensor side:
qcal.quant.autoround).

As Intel's auto-round does it: the driver carries two streams (qcal.model.sequential's
reference stream), the float model's hidden states and the quantized model's. The target
of block i is the float block's output on the float stream; the block being trained reads
the quantized stream, so it also learns to undo the error the blocks before it left; its
quantized outputs then feed block i + 1. Each iteration draws `batch_size` calibration
windows (seeded per layer, so a resumed run draws what the uninterrupted one did), takes
the MSE of the block's output against the target, keeps the parameters of the iteration
with the lowest loss (iteration 0 is RTN's grid) and steps every offset and factor by
lr * sign(grad), the learning rate decaying linearly to 0. Defaults as the reference: 200
iterations, lr = minmax lr = 1 / iters, batch 8. The learned grid is an ordinary integer
grid: every format stores it.

Cost: `iters` forward and backward passes of each block over `batch_size` windows, the most
expensive method qcal has (use --iters for light runs). Memory: one layer, its float copy,
the block's autograd activations for one batch, and three sets of calibration activations
(both streams and the float targets).

This file is the whole method: config, trainer, runner, CLI flags.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from qcal.config import QuantScheme
from qcal.errors import ConfigError
from qcal.methods.registry import (
    MethodFlag,
    QuantMethod,
    RunOptions,
    apply_result,
    layer_spec,
    selection_tag,
)
from qcal.model.arch import ArchSpec
from qcal.model.capture import LayerInputs, compute_dtype, kwargs_on, run_layer
from qcal.model.offload import DiskWeights
from qcal.model.resolve import arch_for
from qcal.model.sequential import layer_linear, resume_fingerprint, sequential_quantize
from qcal.quant import intgrid as grid
from qcal.quant.autoround import sign_step_, signround_result, signround_weight


@dataclasses.dataclass(frozen=True)
class AutoRoundConfig:
    """SignRound's settings: `iters` steps per block at learning rate `lr` for the rounding
    offsets and `minmax_lr` for the clipping factors (None: 1 / iters, as the reference),
    `batch_size` windows per step, `minmax` tuning of the clipping factors on or off, and
    `seed` of the windows each step draws."""

    scheme: QuantScheme = QuantScheme()
    iters: int = 200
    lr: float | None = None
    minmax_lr: float | None = None
    batch_size: int = 8
    minmax: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.iters <= 100_000:
            raise ConfigError(f"iters={self.iters} must lie in [0, 100000]; the reference uses 200")
        for name in ("lr", "minmax_lr"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name}={value} must be a positive number; default 1/iters")
        if not 1 <= self.batch_size <= 4096:
            raise ConfigError(f"batch_size={self.batch_size} must lie in [1, 4096]; try 8")
        if self.seed < 0:
            raise ConfigError(f"seed={self.seed} must be >= 0")

    @property
    def rates(self) -> tuple[float, float]:
        """(lr of the offsets, lr of the clipping factors)."""
        lr = self.lr if self.lr is not None else 1.0 / max(1, self.iters)
        return lr, self.minmax_lr if self.minmax_lr is not None else lr


class _Learned:
    """One linear's learnable grid: offsets v [out, groups, g], factors [out, groups]."""

    def __init__(self, linear: nn.Linear, scheme: QuantScheme) -> None:
        self.linear, self.scheme = linear, scheme
        shape = grid.group_view(linear.weight.detach(), scheme).shape
        self.v = torch.zeros(shape, device=linear.weight.device, requires_grad=True)
        self.f_min = torch.ones(shape[:2], device=linear.weight.device, requires_grad=True)
        self.f_max = torch.ones(shape[:2], device=linear.weight.device, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = signround_weight(self.linear.weight, self.scheme, self.v, self.f_min, self.f_max)
        bias = self.linear.bias
        return nn.functional.linear(x, w.to(x.dtype), None if bias is None else bias.to(x.dtype))

    def clamp_(self) -> None:
        with torch.no_grad():
            self.v.clamp_(-0.5, 0.5)
            self.f_min.clamp_(0.0, 1.0)
            self.f_max.clamp_(0.0, 1.0)

    def state(self) -> tuple[torch.Tensor, ...]:
        return tuple(t.detach().clone() for t in (self.v, self.f_min, self.f_max))


def _shared_kwargs(kwargs: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """The keyword inputs of a step over any `rows` windows: the first batch's, valid only
    because every window of it gets the same masks and positions (checked here: calibration
    windows are unpadded and equally long)."""
    first = kwargs[0]
    for key, value in first.items():
        for t in value if isinstance(value, tuple) else (value,):
            if (isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == rows > 1
                    and not bool((t == t[:1]).all())):
                raise ConfigError(f"AutoRound draws windows across batches, but '{key}' "
                                      "differs between windows (padded calibration?); use "
                                      "equally long, unpadded windows")
    return first


def train_block(layer: nn.Module, names: tuple[str, ...], inputs: LayerInputs,
                targets: list[torch.Tensor], cfg: AutoRoundConfig, scheme_of: Any, device: str,
                generator: torch.Generator) -> tuple[dict[str, Any], float, float, int]:
    """Train the named linears of `layer` in place (they end as QuantResults, returned by
    name); returns (results, iteration 0's loss, the best loss, its iteration)."""
    rows = [(b, r) for b, h in enumerate(inputs.hidden) for r in range(h.shape[0])]
    size = min(cfg.batch_size, len(rows), inputs.hidden[0].shape[0])
    kwargs = _shared_kwargs(inputs.kwargs, size)
    dtype, kw = compute_dtype(layer), kwargs_on(kwargs, device)
    learned = {n: _Learned(layer_linear(layer, n), scheme_of(n)) for n in names}
    frozen = [p for p in layer.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    for item in learned.values():
        item.linear.forward = item.forward  # an instance attribute shadows the class's
    lr, minmax_lr = cfg.rates
    offsets = [item.v for item in learned.values()]
    factors = [t for item in learned.values() for t in (item.f_min, item.f_max)]
    best, first, best_iter = math.inf, math.nan, 0
    best_state = {n: item.state() for n, item in learned.items()}
    try:
        with torch.enable_grad():
            for it in range(cfg.iters):
                pick = torch.randperm(len(rows), generator=generator)[:size].tolist()
                x = torch.stack([inputs.hidden[rows[i][0]][rows[i][1]] for i in pick])
                y = torch.stack([targets[rows[i][0]][rows[i][1]] for i in pick])
                out = layer(x.to(device=device, dtype=dtype), **kw)
                out = out[0] if isinstance(out, tuple) else out
                loss = nn.functional.mse_loss(out.float(), y.to(device).float())
                value = float(loss.detach())
                first = value if it == 0 else first
                if value < best:
                    best, best_iter = value, it
                    best_state = {n: item.state() for n, item in learned.items()}
                loss.backward()
                decay = 1.0 - it / cfg.iters  # linear to 0, as torch's LinearLR(1 -> 0)
                sign_step_(offsets, lr * decay)
                if cfg.minmax:
                    sign_step_(factors, minmax_lr * decay)
                for item in learned.values():
                    item.clamp_()
    finally:
        for item in learned.values():
            item.linear.__dict__.pop("forward", None)
        for p in frozen:
            p.requires_grad_(True)
    results = {n: signround_result(item.linear.weight.detach(), item.scheme, *best_state[n])
               for n, item in learned.items()}
    return results, first, best, best_iter


def run_autoround(model: nn.Module, cfg: AutoRoundConfig, calib: torch.Tensor | None,
                  opts: RunOptions) -> dict[str, float | None]:
    """Quantize every selected linear with SignRound, block by block; returns per-linear
    squared weight errors (the block losses are logged)."""
    if calib is None or calib.numel() == 0:
        raise ConfigError("AutoRound needs calibration token ids; pass --calib with "
                          "--nsamples > 0")
    if opts.dist.active:
        raise ConfigError("AutoRound trains each block on all windows in one process; drop "
                          "--nproc")
    arch: ArchSpec = arch_for(model)

    def one_layer(index: int, layer: nn.Module, inputs: LayerInputs) -> dict[str, Any]:
        assert inputs.reference is not None  # the driver carries it (reference_stream)
        spec = layer_spec(arch, index, opts.selection)
        prefix = f"{arch.layers_path}.{index}."
        targets = run_layer(inputs.reference.layer,
                            dataclasses.replace(inputs, hidden=inputs.reference.hidden,
                                                reference=None), opts.device)
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + index)
        results, first, best, at = train_block(
            layer, tuple(spec.linear_names), inputs, targets, cfg,
            lambda name: opts.selection.scheme_of(prefix + name, cfg.scheme), opts.device,
            generator)
        del targets
        for name, result in results.items():
            apply_result(layer, name, result, opts.packed)
        opts.log(f"autoround layer {index}: block mse {first:.4g} (RTN) -> {best:.4g} "
                 f"(iteration {at})")
        return {name: result.loss for name, result in results.items()}

    with torch.no_grad():
        logs = sequential_quantize(
            model, arch, calib, one_layer, device=opts.device, batch_size=cfg.batch_size,
            progress=opts.progress, desc="autoround", work_dir=opts.work_dir,
            resume=opts.resume,
            fingerprint=(resume_fingerprint("autoround", model, cfg, calib, opts.packed)
                         + selection_tag(opts.selection)),
            weights=DiskWeights(opts.weights_dir) if opts.weights_dir is not None else None,
            max_memory=opts.max_memory, reference_stream=True,
        )
    return {f"{arch.layers_path}.{index}.{name}": loss
            for index, per_layer in logs.items() for name, loss in per_layer.items()}


def option_rules(options: Any) -> None:
    if options.method == "autoround" and getattr(options, "nproc", 1) > 1:
        raise ValueError("--method autoround trains each block in one process; drop --nproc")


FLAGS = (
    MethodFlag("iters", "iters", "AutoRound: signed-gradient steps per block (default "
               "%(default)s, the reference's; fewer for light runs)", value_type=int,
               default=200, schema=Annotated[int, Field(ge=0, le=100_000,
                                                        description="an integer in [0, 100000]")]),
    MethodFlag("autoround_lr", "lr", "AutoRound: learning rate of the rounding offsets and "
               "clipping factors (default 1/iters)", value_type=float, default=None,
               schema=Annotated[float, Field(gt=0, le=1, description="a rate in (0, 1]")] | None),
    MethodFlag("autoround_batch", "batch_size", "AutoRound: calibration windows per step "
               "(default %(default)s)", value_type=int, default=8,
               schema=Annotated[int, Field(ge=1, le=4096, description="an integer in [1, 4096]")]),
    MethodFlag("no_minmax", "minmax", "AutoRound: learn the rounding offsets only, not the "
               "clipping factors", invert=True),
)

METHOD = QuantMethod("autoround", AutoRoundConfig, True, run_autoround, flags=FLAGS,
                     option_rules=option_rules)
