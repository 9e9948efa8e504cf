"""Frozen configuration dataclasses of quantization with a JSON round trip: the integer
grid (`QuantScheme`), the method configs (RTN, GPTQ, AWQ), which linears are quantized
(`ModuleSelection`) and per-module schemes (`SchemeOverride`, --scheme-override).

Configs carry no behaviour: the CLI builds them, the library consumes them, and
every saved artifact stores the config that produced it. The configs of the calibration
data and of evaluation are in qcal.run_config.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

from qcal.errors import ConfigError
from qcal.patterns import PatternError, compiled
from qcal.patterns import match as bounded_match
from qcal.patterns import search as bounded_search

C = TypeVar("C")

SUPPORTED_BITS = (2, 3, 4, 8)


@dataclasses.dataclass(frozen=True)
class QuantScheme:
    """The integer grid: bit width, group size along in_features (-1 = per channel), symmetry.

    A group size that does not divide in_features (128 on SmolLM2's 576, say) is an
    error by default: vLLM's Marlin kernels, torch's CPU int4 op, compressed-tensors and
    the AWQ layout all need whole groups. `allow_ragged` accepts it with a smaller last
    group, as the GPTQ layout allows through g_idx and as qcal's and GPTQModel's torch
    kernels accept. `qcal quantize` picks a dividing size by default (`auto_group_size`).
    """

    bits: int = 4
    group_size: int = 128
    sym: bool = False
    allow_ragged: bool = False

    def __post_init__(self) -> None:
        # Types first: "false" is truthy and would quantize symmetrically; "big" <= 0 raises.
        for name in ("sym", "allow_ragged"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false (a "
                                  "boolean, not a string)")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool):
            raise ConfigError(f"group_size={self.group_size!r} must be an integer: -1 (per "
                              "channel) or a positive size such as 128")
        if self.bits not in SUPPORTED_BITS:
            raise ConfigError(f"bits={self.bits} is not supported; choose one of {SUPPORTED_BITS}")
        if self.group_size != -1 and self.group_size <= 0:
            raise ConfigError(
                f"group_size={self.group_size} is invalid; use -1 (per channel) or a positive size"
            )

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1

    def groups_for(self, in_features: int, name: str = "layer") -> int:
        """Number of groups along in_features; raises ConfigError for an unusable group size."""
        if self.group_size == -1:
            return 1
        if self.group_size > in_features:
            raise ConfigError(
                f"group_size={self.group_size} exceeds in_features={in_features} of {name}; "
                "use a smaller group size or -1 (per channel)"
            )
        if in_features % self.group_size:
            if not self.allow_ragged:
                divisors = [g for g in (32, 64, 128, 256) if in_features % g == 0]
                hint = f"use one of {divisors} or -1" if divisors else "use -1 (per channel)"
                raise ConfigError(
                    f"group_size={self.group_size} does not divide in_features={in_features} "
                    f"of {name}; {hint} (or omit --group-size for the largest that fits), or "
                    "pass --allow-ragged-groups for a smaller last group (loads in qcal and "
                    "GPTQModel's torch kernel, not in Marlin or the CPU int4 op)"
                )
            return -(-in_features // self.group_size)
        return in_features // self.group_size

    def effective_group(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


@dataclasses.dataclass(frozen=True)
class RTNConfig:
    """Round-to-nearest: per-group min/max grid, no calibration data."""

    scheme: QuantScheme = QuantScheme()


@dataclasses.dataclass(frozen=True)
class GPTQConfig:
    """GPTQ (Frantar et al.): column-by-column rounding with Hessian error feedback.

    damp_percent: diagonal damping as a fraction of mean(diag H); grown tenfold on a
    failed Cholesky (up to 1.0). desc_act: act-order (columns by descending diag H,
    groups formed in that order, recorded in g_idx). static_groups: group grids from
    the original weights before any update (with desc_act, groups stay contiguous).
    mse_clip: per-group grid search over shrink factors 1 - i/mse_grid (down to
    1 - mse_maxshrink) minimising |w - q|^mse_norm. act_dtype: storage dtype of the
    layer activations kept between layers ("float32", "float16", "bfloat16").
    imatrix_clip: the same clip search with each column's error weighted by its input
    channel's calibration energy (diag H, llama.cpp's imatrix); implies the search.
    """

    scheme: QuantScheme = QuantScheme()
    damp_percent: float = 0.01
    block_size: int = 128
    desc_act: bool = False
    static_groups: bool = False
    true_sequential: bool = True
    mse_clip: bool = False
    mse_grid: int = 100
    mse_maxshrink: float = 0.8
    mse_norm: float = 2.4
    act_dtype: str = "float32"
    # Added after keys were written: joins a cache key only when set.
    imatrix_clip: bool = dataclasses.field(default=False, metadata={"key_if_set": True})

    def __post_init__(self) -> None:
        if not 0 < self.damp_percent < 1:
            raise ConfigError(f"damp_percent={self.damp_percent} must lie in (0, 1); try 0.01")
        if self.block_size <= 0:
            raise ConfigError(f"block_size={self.block_size} must be positive; try 128")
        if self.mse_grid <= 0 or not 0 <= self.mse_maxshrink < 1:
            raise ConfigError(
                f"mse_grid={self.mse_grid} / mse_maxshrink={self.mse_maxshrink} are invalid; "
                "use a positive grid and a shrink in [0, 1), e.g. 100 and 0.8"
            )
        if self.act_dtype not in ("float32", "float16", "bfloat16"):
            raise ConfigError(
                f"act_dtype={self.act_dtype!r} is not supported; use float32, float16 or bfloat16"
            )


@dataclasses.dataclass(frozen=True)
class AWQConfig:
    """AWQ: activation-aware scale search (grid over s_x^ratio) then per-group clip search.

    grid_points: ratios tried, {0, 1/n, ..., (n-1)/n}; duo_scaling divides by s_w^(1-ratio);
    clip_grid/max_shrink: clip thresholds max * (1 - i/clip_grid) for i < max_shrink * clip_grid;
    clip_tokens: tokens subsampled to score a clip;
    search_tokens: calibration tokens the scale search scores each ratio on (0: all). A block
    that maps tokens independently (an MLP) gets an even token subsample, attention whole
    calibration batches; a lone linear always uses every token (exactly, via its Gram matrix);
    coarse_to_fine: score every other ratio, then the best one's two neighbours (12 of 20).
    """

    scheme: QuantScheme = QuantScheme()
    grid_points: int = 20
    duo_scaling: bool = False
    clip_search: bool = True
    clip_grid: int = 20
    max_shrink: float = 0.5
    clip_tokens: int = 512
    search_tokens: int = 4096
    coarse_to_fine: bool = True

    def __post_init__(self) -> None:
        if self.search_tokens < 0:
            raise ConfigError(f"search_tokens={self.search_tokens} must be >= 0 (0: every "
                              "calibration token); try 4096")
        if self.grid_points < 1:
            raise ConfigError(f"grid_points={self.grid_points} must be >= 1; try 20")
        if self.clip_grid < 1:
            raise ConfigError(f"clip_grid={self.clip_grid} must be >= 1; try 20")
        if not 0 <= self.max_shrink < 1:
            raise ConfigError(f"max_shrink={self.max_shrink} must lie in [0, 1); try 0.5")
        if self.clip_tokens < 1:
            raise ConfigError(f"clip_tokens={self.clip_tokens} must be >= 1; try 512")


@dataclasses.dataclass(frozen=True)
class ModuleSelection:
    """Which linears of the decoder layers are quantized, matched by `re.search` on their full
    names (model.layers.0.mlp.down_proj): all by default; `targets` keeps only matches,
    `ignore` then drops matches (kept float). `moe_all_experts` sends every calibration token
    through every MoE expert (outputs discarded) so no expert lacks calibration data."""

    targets: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    moe_all_experts: bool = False
    # --scheme-override: per-linear schemes (first match wins; `skip` keeps a linear float).
    # They live here because they say, like targets/ignore, what happens to which linear, and
    # so reach the runners, the resume tags and the checkpoint key with the selection.
    schemes: tuple[SchemeOverride, ...] = ()

    def __post_init__(self) -> None:
        for flag, field in (("--targets", "targets"), ("--ignore", "ignore")):
            value = getattr(self, field)
            # A lone string is one pattern, never its characters (issue 52: the API's
            # targets="q_proj" became 'q', '_', 'p', ... and matched every linear).
            patterns = (value,) if isinstance(value, str) else tuple(value)
            object.__setattr__(self, field, patterns)
            for pattern in patterns:
                if not isinstance(pattern, str):
                    raise ConfigError(f"{flag} takes regexes as strings, not "
                                      f"{type(pattern).__name__} {pattern!r}; pass e.g. "
                                      f"{field}=[r'q_proj$']")
                try:
                    compiled(pattern)
                except PatternError as err:
                    raise ConfigError(f"{flag} {pattern[:80]!r}: {err}; fix the pattern, e.g. "
                                      "'mlp\\.gate$'") from None

    def selects(self, name: str) -> bool:
        if self.targets and not any(search_pattern("--targets", p, name) for p in self.targets):
            return False
        if any(search_pattern("--ignore", p, name) for p in self.ignore):
            return False
        for override in self.schemes:  # the first matching override decides
            if match_pattern("--scheme-override", override.pattern, name):
                return not override.skip
        return True

    def scheme_of(self, name: str, base: QuantScheme) -> QuantScheme:
        """The scheme linear `name` (full name) is quantized with: its first matching
        --scheme-override applied to `base`, else `base`."""
        return scheme_for(name, base, self.schemes) or base

    def is_default(self) -> bool:
        return self == ModuleSelection()


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    return json.dumps({"type": type(cfg).__name__, **to_dict(cfg)}, indent=2, sort_keys=True)


SAFE_GROUP_SIZES = (128, 64, 32)


def auto_group_size(in_features: set[int] | list[int]) -> int:
    """The largest of 128/64/32 that divides every in_features, else -1 (per channel)."""
    for group in SAFE_GROUP_SIZES:
        if all(n % group == 0 for n in in_features):
            return group
    return -1


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a (possibly nested) config dataclass; unknown keys are an error."""
    data = {k: v for k, v in data.items() if k != "type"}
    if cls is QuantScheme and "strict_groups" in data:  # before ragged groups became opt-in
        data["allow_ragged"] = not data.pop("strict_groups")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        ftype = fields[name].type
        if isinstance(value, dict) and (ftype == "QuantScheme" or ftype is QuantScheme):
            value = from_dict(QuantScheme, value)
        elif cls is ModuleSelection and name == "schemes":
            value = tuple(o if isinstance(o, SchemeOverride) else from_dict(SchemeOverride, o)
                          for o in value)
        elif isinstance(value, list):  # JSON's lists: tuples, nested ones too ((task, n) pairs)
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kwargs[name] = value
    return cls(**kwargs)


def from_json(cls: type[C], text: str) -> C:
    return from_dict(cls, json.loads(text))


# --- per-module schemes (--scheme-override 'REGEX=bits:8,group:128') ------------------
# Storable widths per checkpoint format: compressed-tensors packs 1-8 bits as a dense bit
# stream, the GPTQ layout 2/3/4/8 (3-bit codes straddle words); AutoAWQ's GEMM layout is
# 4-bit only. qcal's QuantLinear holds 2, 3, 4 and 8.
FORMAT_BITS = {"compressed-tensors": (2, 3, 4, 8), "gptq": (2, 3, 4, 8),
               "gptq_v2": (2, 3, 4, 8), "awq": (4,)}
OVERRIDE_KEYS = {"bits": "bits", "group": "group_size", "group_size": "group_size", "sym": "sym"}


@dataclasses.dataclass(frozen=True)
class SchemeOverride:
    """Linears whose full name matches `pattern` (re.match from the start, as GPTQModel's
    `dynamic`) take these scheme fields instead of the base scheme's; `skip` leaves them
    in float. The first matching override wins."""

    pattern: str
    bits: int | None = None
    group_size: int | None = None
    sym: bool | None = None
    skip: bool = False

    def __post_init__(self) -> None:
        try:
            compiled(self.pattern)
        except PatternError as err:
            raise ConfigError(f"--scheme-override pattern {str(self.pattern)[:80]!r}: {err}"
                              ) from None
        if self.bits is not None and self.bits not in SUPPORTED_BITS:
            raise ConfigError(f"--scheme-override {self.pattern!r}: bits={self.bits} is not "
                              f"supported; choose one of {SUPPORTED_BITS}")
        if self.group_size is not None and (self.group_size == 0 or self.group_size < -1):
            raise ConfigError(f"--scheme-override {self.pattern!r}: group {self.group_size} is "
                              "invalid; use -1 (per channel) or a positive size such as 128")

    def spec(self) -> str:
        """The override as --scheme-override writes it (for logs and model cards)."""
        if self.skip:
            return f"{self.pattern}=skip"
        parts = [f"{k}:{v}" for k, v in (("bits", self.bits), ("group", self.group_size))
                 if v is not None] + ([f"sym:{str(self.sym).lower()}"] if self.sym is not None
                                      else [])
        return f"{self.pattern}={','.join(parts)}"


def parse_scheme_override(text: str) -> SchemeOverride:
    """'REGEX=bits:8,group:128[,sym:true]' or 'REGEX=skip' as a SchemeOverride."""
    pattern, sep, spec = text.rpartition("=")
    if not sep or not pattern or not spec:
        raise ConfigError(f"--scheme-override {text!r}: write REGEX=bits:8,group:128 (or "
                          "REGEX=skip to keep matching linears in float)")
    if spec.strip() == "skip":
        return SchemeOverride(pattern, skip=True)
    fields: dict[str, Any] = {}
    for item in spec.split(","):
        key, _, value = item.partition(":")
        field = OVERRIDE_KEYS.get(key.strip())
        if field is None or not value.strip():
            raise ConfigError(f"--scheme-override {text!r}: {item!r} is not one of bits:N, "
                              "group:N, sym:true|false")
        value = value.strip().lower()
        if field == "sym":
            if value not in ("true", "false"):
                raise ConfigError(f"--scheme-override {text!r}: sym takes true or false")
            fields[field] = value == "true"
        else:
            try:
                fields[field] = int(value)
            except ValueError:
                raise ConfigError(f"--scheme-override {text!r}: {key} needs a whole number") from None
    return SchemeOverride(pattern, **fields)


def scheme_for(name: str, base: QuantScheme,
               overrides: tuple[SchemeOverride, ...] = ()) -> QuantScheme | None:
    """The scheme of the linear `name`: the first matching override applied to `base`
    (None: the override keeps it in float), else `base`. Pure: runners call it per linear."""
    for override in overrides:
        if match_pattern("--scheme-override", override.pattern, name):
            return _applied(base, override)
    return base


def _applied(base: QuantScheme, override: SchemeOverride) -> QuantScheme | None:
    if override.skip:
        return None
    changes = {k: v for k, v in (("bits", override.bits), ("group_size", override.group_size),
                                 ("sym", override.sym)) if v is not None}
    return dataclasses.replace(base, **changes)


def check_overrides(base: QuantScheme, overrides: tuple[SchemeOverride, ...], fmt: str) -> None:
    """Refuse, before any model loads, a width the checkpoint format cannot store."""
    storable = FORMAT_BITS.get(fmt, ())
    for scheme in [base, *(_applied(base, o) for o in overrides)]:
        if scheme is not None and scheme.bits not in storable:
            widths = ", ".join(map(str, storable[:-1])) + " or " * (len(storable) > 1) \
                + str(storable[-1])
            hint = ("use --format compressed-tensors for other widths" if fmt == "awq" else
                    "pick one of those")
            raise ConfigError(f"--format {fmt} stores {widths}-bit weights, not "
                              f"{scheme.bits}-bit; {hint}")


def search_pattern(flag: str, pattern: str, name: str) -> bool:
    """re.search of a user's `pattern` (named by `flag` in the error) with a time bound."""
    try:
        return bounded_search(pattern, name)
    except PatternError as err:
        raise ConfigError(f"{flag} {pattern[:80]!r}: {err}") from None


def match_pattern(flag: str, pattern: str, name: str) -> bool:
    """re.match of a user's `pattern` (named by `flag` in the error) with a time bound."""
    try:
        return bounded_match(pattern, name)
    except PatternError as err:
        raise ConfigError(f"{flag} {pattern[:80]!r}: {err}") from None
