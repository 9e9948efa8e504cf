"""Per-module schemes (--scheme-override) at the boundaries: what a checkpoint format can
store, whether each pattern names a quantized linear of the model (from its meta skeleton,
before any weight is read), and what the checkpoint writers add: GPTQModel's `dynamic`
field (read back by `qcal.packing.formats.dynamic_scheme`) and the stored symmetry; and
`validate_scheme`, the check every quantized linear passes before any work (`qcal quantize`
on the loaded model, the grid on the skeleton).

The per-linear resolution itself is `qcal.config.scheme_for` (first matching override
wins, as GPTQModel's `dynamic`); runners reach it through `ModuleSelection.scheme_of`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from qcal.config import (
    FORMAT_BITS,
    ModuleSelection,
    QuantScheme,
    SchemeOverride,
    check_overrides,
    match_pattern,
    scheme_for,
    search_pattern,
)
from qcal.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn


def check_format(base: QuantScheme, overrides: tuple[SchemeOverride, ...], fmt: str) -> None:
    """Refuse what checkpoint format `fmt` cannot store, before any model is loaded."""
    if not overrides:
        return
    if fmt == "awq" and any(not o.skip for o in overrides):
        raise ConfigError("--format awq (AutoAWQ's GEMM layout) holds one scheme for every "
                          "linear; use --format compressed-tensors or gptq with "
                          "--scheme-override")
    check_overrides(base, overrides, fmt)
    if fmt not in FORMAT_BITS:
        raise ConfigError(f"--format {fmt!r} is unknown; use one of {', '.join(FORMAT_BITS)}")


def linear_shapes(skeleton: nn.Module) -> dict[str, tuple[int, int]]:
    """Full name -> (in_features, out_features) of every linear the resolved ArchSpec
    quantizes, read from the model's meta skeleton (`qcal.model.shapes.skeleton`: no weights)."""
    from qcal.model.arch import decoder_layers, get_module
    from qcal.model.resolve import arch_for

    arch = arch_for(skeleton)
    return {f"{arch.layers_path}.{i}.{name}": (int(get_module(layer, name).in_features),
                                                int(get_module(layer, name).out_features))
            for i, layer in enumerate(decoder_layers(skeleton, arch))
            for name in arch.linear_names}


def packing_unit(bits: int) -> int:
    """How many channels a packed dimension must be a multiple of: codes fill whole int32
    words, 32/bits of them (3 bits: 32 codes in 3 words)."""
    return 32 // math.gcd(32, bits)


def validate_scheme(model: nn.Module, scheme: QuantScheme,
                    selection: ModuleSelection | None = None) -> None:
    """Fail before any work if the scheme cannot serve every quantized linear."""
    from qcal_kernels.format import PACKABLE_BITS

    from qcal.methods import iter_layer_linears
    from qcal.model.arch import get_module
    from qcal.model.resolve import arch_for

    arch = arch_for(model)
    every = iter_layer_linears(model, arch)
    names = [(i, n) for i, n in every if selection is None or selection.selects(n)]
    if selection is not None and not names:
        raise ConfigError("--targets/--ignore leave no linear to quantize; loosen the patterns")
    conv1d = {n for n in arch.adapted if n in arch.linear_names}
    # One set, not one per linear: a big MoE model has tens of thousands of expert linears.
    chosen = {n for _, n in names}
    kept = [n for i, n in every if n not in chosen and n.rsplit(f"{i}.", 1)[-1] in conv1d]
    if kept:
        # A Conv1D kept float would be saved transposed under its Conv1D name.
        raise ConfigError(f"{kept[0]} is a Conv1D, which qcal can only store quantized; "
                          "drop the --targets/--ignore pattern that keeps it float")
    for _, name in names:
        linear = get_module(model, name)
        own = selection.scheme_of(name, scheme) if selection is not None else scheme
        own.groups_for(linear.in_features, name)
        per = packing_unit(own.bits) if own.bits in PACKABLE_BITS else 1
        for what, size in (("out_features", linear.out_features),
                           ("in_features", linear.in_features)):
            if size % per:
                raise ConfigError(
                    f"{name} has {what}={size}, not a multiple of {per}; {own.bits}-bit "
                    "packing needs that (pick another width for it with --scheme-override)"
                )


def check_against_model(shapes: dict[str, tuple[int, int]], selection: ModuleSelection,
                        base: QuantScheme) -> None:
    """Each override must match a linear that --targets/--ignore leave quantized, each
    linear's own group size must divide its in_features, and its codes must fill whole
    int32 words (3 bits: 32 codes in 3 words) along both dimensions (before any work)."""
    example = next(iter(shapes), "model.layers.0.mlp.down_proj")
    for flag, patterns in (("--targets", selection.targets), ("--ignore", selection.ignore)):
        for pattern in patterns:  # a pattern that matches nothing is a typo, never a no-op
            if not any(search_pattern(flag, pattern, n) for n in shapes):
                raise ConfigError(f"{flag} {pattern[:80]!r} matches no linear of this model's "
                                  f"decoder layers (patterns are searched in full names such "
                                  f"as {example!r}); fix the pattern or drop it")
    plain = ModuleSelection(selection.targets, selection.ignore, selection.moe_all_experts)
    chosen = [n for n in shapes if plain.selects(n)]
    for override in selection.schemes:
        if not any(match_pattern("--scheme-override", override.pattern, n) for n in chosen):
            example = chosen[0] if chosen else "model.layers.0.mlp.down_proj"
            raise ConfigError(f"--scheme-override {override.spec()!r} matches no quantized "
                              f"linear of this model (patterns match full names from the start, "
                              f"e.g. {example!r}; try '.*' + your pattern)")
    for name in chosen:
        scheme = scheme_for(name, base, selection.schemes)
        rule = next((o for o in selection.schemes
                     if match_pattern("--scheme-override", o.pattern, name)), None)
        if scheme is None or rule is None:
            continue  # the base scheme is checked against every linear by validate_scheme
        in_f, out_f = shapes[name]
        per = packing_unit(scheme.bits)
        if in_f % per or out_f % per:
            raise ConfigError(f"--scheme-override {rule.spec()!r}: {name} is {out_f}x{in_f}, "
                              f"but {scheme.bits}-bit codes fill int32 words only for sizes "
                              f"divisible by {per}; pick 2, 4 or 8 bits for it")
        if rule.group_size is None:
            continue  # the base scheme's group size was checked with --group-size
        try:
            scheme.groups_for(in_f, name)
        except ConfigError as err:
            raise ConfigError(f"--scheme-override {rule.spec()!r}: group {rule.group_size} does "
                              f"not divide in_features={in_f} of {name}; use one that "
                              "does (e.g. 32, 64) or -1 (per channel)") from err


def gptq_dynamic(overrides: tuple[SchemeOverride, ...]) -> dict[str, dict[str, Any]]:
    """GPTQModel's `dynamic` quantization_config field for `overrides`: `+:REGEX` with the
    fields that differ from the base scheme, `-:REGEX` for linears kept float. GPTQModel
    applies the first matching `+:` rule, so the order is the overrides' order; a rule
    whose fields equal the base scheme's is still written (it changes nothing)."""
    out: dict[str, dict[str, Any]] = {}
    for override in overrides:
        if override.skip:
            out[f"-:{override.pattern}"] = {}
            continue
        fields = {"bits": override.bits, "group_size": override.group_size, "sym": override.sym}
        out[f"+:{override.pattern}"] = {k: v for k, v in fields.items() if v is not None}
    return out


def stored_sym(base: QuantScheme, overrides: tuple[SchemeOverride, ...]) -> bool:
    """Whether every quantized linear is symmetric, so the checkpoint can drop zero points.
    A symmetric linear in an asymmetric checkpoint stores its (midpoint) zero points: exact."""
    return base.sym and all(o.sym is not False for o in overrides if not o.skip)


def format_fields(base: QuantScheme, overrides: tuple[SchemeOverride, ...], fmt: str,
                  fields: dict[str, Any]) -> dict[str, Any]:
    """A method's quantization_config fields plus what per-module schemes add: in the GPTQ
    formats the base scheme and GPTQModel's `dynamic` rules (compressed-tensors says the
    same with one config group per scheme, built from the layers themselves)."""
    if not overrides or not fmt.startswith("gptq"):
        return fields
    return {**fields, "bits": base.bits, "group_size": base.group_size,
            "dynamic": gptq_dynamic(overrides)}


def format_note(base: QuantScheme, overrides: tuple[SchemeOverride, ...], fmt: str) -> str | None:
    """What the user should know about loaders when per-module schemes meet a format: bare
    transformers 5.24 decompresses an asymmetric compressed-tensors checkpoint with one
    config group's scheme for every dense linear, so with several schemes it refuses the
    file (a size mismatch); qcal and vLLM read each group's own scheme."""
    reshapes = any(o.bits is not None or o.group_size is not None for o in overrides
                   if not o.skip)
    if fmt != "compressed-tensors" or not reshapes or stored_sym(base, overrides):
        return None
    return ("asymmetric per-module schemes: qcal.load and vLLM read each config group's "
            "scheme; bare transformers 5.24 cannot load several asymmetric groups (add "
            "--sym, or sym:true to every override, for a checkpoint transformers loads)")
