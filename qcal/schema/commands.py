"""The options of every `qcal` command as typed models: one field per argparse `dest`,
with its type, range and the rules that tie options together.

To add an option: `p.add_argument("--foo", ...)` in the command's `add_parser`, and a
field `foo: <type> = <default>` in its model below (the type carries the range; a rule
between options goes into the model's `_rules`). A method's own flags are not listed here:
they are declared in the method's file and join `QuantizeOptions` from the registry.
tests/unit/test_schema_coverage.py fails for an argparse option without a field here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, create_model, model_validator

# Bit widths each checkpoint format can pack (one table for the CLI and the library).
from qcal.config import FORMAT_BITS
from qcal.methods import all_methods
from qcal.schema.fields import (
    MAX_LIST,
    Batch,
    Bins,
    Bits,
    Count,
    Device,
    ExistingDir,
    ExistingFile,
    Flag,
    GroupSizeNumber,
    NonNegative,
    Options,
    Processes,
    Regex,
    RotationText,
    SchemeOverrideText,
    Seed,
    Selector,
    SeqLen,
    Size,
    Source,
    Text,
    check_chat_source,
    plain_list,
    selector_langs,
)

FORMATS = ("gptq", "gptq_v2", "compressed-tensors", "awq")
# A record field name (JSONL, Parquet, datasets): an identifier, never a path or expression.
TextField = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", max_length=100)]
Format = Literal["gptq", "gptq_v2", "compressed-tensors", "awq"]


def check_group_size(value: str | int) -> str | int:
    if str(value) == "auto":
        return "auto"
    try:
        group = int(str(value))
    except ValueError:
        raise ValueError("must be auto, -1 (per channel) or a positive integer such as 32, 64 "
                         "or 128") from None
    if group != -1 and group < 1:
        raise ValueError("must be auto, -1 (per channel) or a positive integer such as 128")
    return value


def check_method(name: str) -> str:
    from qcal.methods import METHODS
    from qcal.schema.fields import did_you_mean

    if name not in METHODS:
        raise ValueError(f"unknown method; {did_you_mean(name, METHODS.names())}known: "
                         f"{', '.join(METHODS.names())}")
    return name


def known_langs(langs: list[str], source: str, flag: str) -> None:
    """Each language is provisioned in the packaged corpus `source` (checked before any work)."""
    from qcal.data import PACKAGED_SOURCES, available_languages
    from qcal.errors import QcalError
    from qcal.schema.fields import did_you_mean

    if not langs or source not in PACKAGED_SOURCES:
        return
    try:
        have = available_languages(source)
    except QcalError as err:
        raise ValueError(str(err)) from None
    for lang in langs:
        if lang not in have:
            raise ValueError(f"{flag} {lang!r} is not in {source}; {did_you_mean(lang, have)}"
                             f"available: {', '.join(have)}")


Method = Annotated[str, AfterValidator(check_method)]
GroupSize = Annotated[str | int, AfterValidator(check_group_size)]


# In each model `device` comes first: fields are checked in order, and a device this machine
# lacks is the first thing to say.
class QuantizeBase(Options):
    """The options of `qcal quantize` that are no method's own; each method's flags join
    them in `QuantizeOptions` (from the method registry)."""

    device: Device = "auto"
    model: Text | None = None
    method: Method = "rtn"
    bits: Bits = Field(4, description="2, 3, 4 or 8 (what a checkpoint can pack)", examples=[4])
    group_size: GroupSize = "auto"
    sym: Flag = False
    allow_ragged_groups: Flag = False
    strict_groups: Flag = False
    awq_artifact: ExistingFile | None = None
    calib: Source = "debian-handbook"
    selector: Selector | None = None
    nsamples: Count = 128
    seqlen: SeqLen = 512
    seed: Seed = 0
    nproc: Processes = 1
    resume: Flag = False
    overwrite: Flag = False
    keep_work: Flag = False
    trust_remote_code: Flag = False
    format: Format = "compressed-tensors"
    eval: Flag = False
    eval_langs: Text = "en"
    eval_windows: Count = 16
    output: Path | None = None
    text_field: TextField = "text"
    chat: Flag = False
    targets: Annotated[list[Regex], Field(max_length=MAX_LIST)] = []
    ignore: Annotated[list[Regex], Field(max_length=MAX_LIST)] = []
    moe_all_experts: Flag = False
    scheme_override: Annotated[list[SchemeOverrideText], Field(max_length=MAX_LIST)] = []
    rotate: RotationText | None = None
    show_arch: Flag = False
    shard_size: Size = "2GB"
    max_memory: Size | Literal["auto"] = "auto"

    @model_validator(mode="after")
    def _rules(self) -> QuantizeBase:
        allowed = FORMAT_BITS[self.format]
        if self.bits not in allowed:
            raise ValueError(f"--bits {self.bits} cannot be packed in --format {self.format}; "
                             f"choose --bits {' or '.join(map(str, allowed))}")
        if self.resume and self.overwrite:  # issue 52: one of them was silently ignored
            raise ValueError("--resume continues an interrupted run and --overwrite starts over; "
                             "pass one of them")
        for method in all_methods():  # each method's rules on its own flags
            method.option_rules(self)
        if self.allow_ragged_groups and self.format in ("compressed-tensors", "awq"):
            raise ValueError(f"--allow-ragged-groups cannot be stored in --format {self.format}, "
                             "which needs whole groups; drop it or use --format gptq")
        if self.scheme_override:  # widths and layouts the format cannot store
            from qcal.config import QuantScheme, parse_scheme_override
            from qcal.errors import ConfigError
            from qcal.schemes import check_format

            try:
                check_format(QuantScheme(self.bits, sym=self.sym),
                             tuple(map(parse_scheme_override, self.scheme_override)), self.format)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        if self.awq_artifact is not None and self.scheme_override:
            raise ValueError("--awq-artifact replays a search with the schemes it was made with; "
                             "drop --scheme-override (or search again without --awq-artifact)")
        if self.awq_artifact is not None and self.method != "awq":
            raise ValueError("--awq-artifact replays an AWQ search; use it with --method awq")
        known_langs(selector_langs(self.selector), self.calib, "--selector language")
        if self.chat:
            check_chat_source(self.calib, "--calib")
        langs = plain_list(self.eval_langs, "language")
        if self.eval:
            if not langs:
                raise ValueError("--eval-langs is empty; give languages such as en,de")
            known_langs(langs, "debian-handbook", "--eval-langs")
        return self


def method_flag_fields() -> dict[str, Any]:
    """Every method's CLI flags as schema fields (dest -> (type, default)), from the registry."""
    return {flag.dest: (flag.schema, flag.default) for method in all_methods()
            for flag in method.flags}


QuantizeOptions = create_model("QuantizeOptions", __base__=QuantizeBase,
                               __module__=__name__, **method_flag_fields())


class EvalOptions(Options):
    device: Device = "auto"
    model: Text | None = None
    base: Text | None = None
    ppl: Flag = False
    langs: Text = "en"
    source: Source = "debian-handbook"
    text: ExistingFile | None = None
    seqlen: SeqLen = 512
    stride: Count | None = None
    batch_size: Batch = 4
    max_windows: Count | None = None
    tasks: Text | None = None
    include_path: Annotated[list[ExistingDir], Field(max_length=MAX_LIST)] = []
    limit: Count | None = None
    task_limit: Annotated[list[Text], Field(max_length=MAX_LIST)] = []
    num_fewshot: NonNegative | None = None
    task_batch_size: Batch = 16
    confidence: Flag = False
    ece_bins: Bins = 15
    list_tasks: Flag = False
    backend: Literal["hf", "vllm"] = "hf"
    trust_remote_code: Flag = False
    output: Path | None = None
    overwrite: Flag = False
    scores: Path | None = None

    @model_validator(mode="after")
    def _rules(self) -> EvalOptions:
        tasks = plain_list(self.tasks, "task name")
        if self.scores is not None:
            if not tasks:
                raise ValueError("--scores keeps lm-eval log-likelihoods: add --tasks")
            if self.scores.exists() and not self.scores.is_dir():
                raise ValueError(f"--scores {self.scores} is a file; name a folder (qcal "
                                 "creates it and one file per model in it)")
            if self.backend == "vllm":
                raise ValueError("--scores works with --backend hf only")
        if self.langs != "all":
            langs = plain_list(self.langs, "language")
            if (self.ppl or not tasks) and self.text is None:
                known_langs(langs, self.source, "--langs")
        if self.confidence and not tasks:
            raise ValueError("--confidence scores multiple-choice items: add --tasks "
                             "(e.g. --tasks qcal_nextsent_en)")
        for text in self.task_limit:
            task, sep, n = text.partition("=")
            if not sep or not task.strip() or not n.strip().isdigit() or int(n) < 1:
                raise ValueError(f"--task-limit {text!r}: write TASK=N with N a positive number (>= 1), e.g. "
                                 "--task-limit mmlu=50")
            if task.strip() not in tasks:
                raise ValueError(f"--task-limit names {task.strip()!r}, which is not in --tasks")
        return self


class CalibBuildOptions(Options):
    device: Device = "auto"
    selector: Selector = "random"
    source: Source = "debian-handbook"
    model: Text | None = None
    n: Count = 128
    seqlen: SeqLen = 512
    seed: Seed = 0
    langs: Text | None = None
    weights: Text | None = None
    mix: Text | None = None
    inner: Text | None = None
    mode: Literal["low", "high", "middle"] | None = None
    objective: Literal["coverage", "invfreq"] | None = None
    pool_size: Count | None = None
    ref_model: Text | None = None
    batch_size: Batch | None = None
    score_tokens: Count | None = None
    max_candidates: Count | None = None
    no_pack: Flag = False
    max_windows_per_doc: Count | None = None
    output: Path | None = None
    overwrite: Flag = False
    trust_remote_code: Flag = False
    text_field: TextField = "text"
    chat: Flag = False

    @model_validator(mode="after")
    def _rules(self) -> CalibBuildOptions:
        if self.chat:
            check_chat_source(self.source, "--source")
        langs = plain_list(self.langs, "language")
        known_langs(langs, self.source, "--langs")
        known_langs(selector_langs(self.selector), self.source, "--selector language")
        if self.mix is not None:
            from qcal.schema.fields import check_selector

            check_selector(f"mix:{self.mix}")
        if self.weights is not None:
            try:
                weights = [float(w) for w in self.weights.split(",") if w.strip()]
            except ValueError:
                raise ValueError(f"--weights {self.weights!r}: give numbers, e.g. 0.5,0.5") from None
            if any(not w > 0 for w in weights):
                raise ValueError(f"--weights {self.weights!r}: every weight must be > 0")
            if len(weights) != len(langs):
                raise ValueError("--weights needs --langs with one weight per language")
        return self


class CalibShowOptions(Options):
    name: Text
    full: Flag = False


class CalibListOptions(Options):
    dir: Path | None = None


class CalibDiagnoseOptions(Options):
    device: Device = "auto"
    set: Source
    model: Text | None = None
    nsamples: Count = 128
    seqlen: SeqLen = 512
    seed: Seed = 0
    target: Text = "en"
    target_windows: Count = 16
    layers: Text = "0,mid,last"
    bits: Bits = 4
    group_size: GroupSizeNumber = 128
    no_model: Flag = False
    output: Path | None = None
    overwrite: Flag = False
    trust_remote_code: Flag = False


class CompareOptions(Options):
    device: Device = "auto"
    config: ExistingFile | None = None
    name: Text | None = None
    model: Text | None = None
    selectors: Text | None = None
    methods: Text | None = None
    bits: Bits | None = None
    group_size: GroupSizeNumber | None = None
    sym: Flag | None = None
    desc_act: Flag | None = None
    source: Source | None = None
    nsamples: Count | None = None
    seqlen: SeqLen | None = None
    seed: Seed | None = None
    eval: Text | None = None
    eval_langs: Text | None = None
    eval_seqlen: SeqLen | None = None
    max_windows: Count | None = None
    limit: Count | None = None
    results_dir: Path | None = None
    shard: Text | None = None
    executor: Literal["local", "ray"] = "local"
    address: Text | None = None
    jobs: Processes = 1
    discard_checkpoints: Flag = False
    max_cells: Count = 200

    @model_validator(mode="after")
    def _rules(self) -> CompareOptions:
        if self.shard is not None:
            index, _, count = self.shard.partition("/")
            if not (index.strip().isdigit() and count.strip().isdigit()) or not (
                    0 <= int(index) < int(count)):
                raise ValueError(f"--shard {self.shard!r} is not I/N with 0 <= I < N (e.g. 0/4)")
        if self.address is not None and self.executor != "ray":
            raise ValueError("--address joins a Ray cluster; add --executor ray or drop --address")
        return self


class ReportOptions(Options):
    # checked by the report itself (its message names `qcal compare`)
    run_dir: Annotated[list[Path], Field(max_length=MAX_LIST)] = []
    title: Text | None = None
    study: Text | None = None  # the studies (outside the core) check their own names
    out: Path | None = None
    bench_grid: Annotated[list[Path], Field(max_length=MAX_LIST)] | None = None
    out_benchmarks: Path | None = None


class ExportOptions(Options):
    model: Text
    format: Format
    output: Path
    overwrite: Flag = False


class ProvisionOptions(Options):
    only: Text = "model,data,benchmarks"
    models: Text | None = None
    force: Flag = False

    @model_validator(mode="after")
    def _rules(self) -> ProvisionOptions:
        from qcal.schema.fields import did_you_mean

        parts = ("model", "models", "data", "benchmarks")
        for part in (x.strip() for x in self.only.split(",") if x.strip()):
            if part not in parts:
                raise ValueError(f"--only {part!r} is not a part; {did_you_mean(part, parts)}"
                                 "choose from model, data, benchmarks")
        from qcal.paths import PROVISIONED_MODELS

        for name in (x.strip() for x in (self.models or "").split(",") if x.strip()):
            if name != "all" and name not in PROVISIONED_MODELS:
                raise ValueError(f"--models {name!r} is not a model qcal provisions; "
                                 f"{did_you_mean(name, PROVISIONED_MODELS)}choose from "
                                 f"{', '.join(PROVISIONED_MODELS)} or all")
        return self


# `qcal <command> [<subcommand>]` -> its options model.
COMMAND_SCHEMAS: dict[str, type[Options]] = {
    "quantize": QuantizeOptions, "eval": EvalOptions, "calib build": CalibBuildOptions,
    "calib show": CalibShowOptions, "calib list": CalibListOptions,
    "calib diagnose": CalibDiagnoseOptions, "compare": CompareOptions,
    "report": ReportOptions, "export": ExportOptions, "provision": ProvisionOptions,
}
