"""Building blocks of the input schema: value types with their ranges, the plain-name and
source rules, and the one-line rendering of a validation error.

Every rule here is data pydantic enforces; the messages name the value, the allowed range
and a fix, so `qcal` can print them as its one error line.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationError,
)

from qcal.errors import ConfigError

# Strict: YAML's "false" (a string) or 0 is never taken for a boolean.
Flag = StrictBool
# Issue 52: every value bounded, so a typo of a few digits is refused instead of started.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="an integer in [0, 2^32 - 1]",
                            examples=[0])]
Count = Annotated[int, Field(ge=1, le=1_000_000, description="an integer in [1, 1000000]")]
SeqLen = Annotated[int, Field(ge=2, le=1 << 20, description="an integer in [2, 1048576] "
                              "(tokens per window)", examples=[512])]
Damp = Annotated[float, Field(gt=0, lt=1, description="a fraction in (0, 1)", examples=[0.01])]
NonNegative = Annotated[int, Field(ge=0, le=1_000_000, description="an integer in [0, 1000000]")]
Batch = Annotated[int, Field(ge=1, le=4096, description="an integer in [1, 4096]")]
Bits = Annotated[int, Field(ge=1, le=16, description="bits per weight")]
GroupSizeNumber = Annotated[int, Field(ge=-1, le=1 << 20, description="-1 or a group size")]
Text = Annotated[str, StringConstraints(max_length=4096)]
MAX_LIST = 1000  # list-valued options and grid axes: longer is a mistake, not a study
Bins = Annotated[int, Field(ge=1, le=1000, description="an integer in [1, 1000]")]


def _at_most_cpus(value: int) -> int:
    # Each process holds a model copy: 145 of --nproc 10000 filled 23 GB before this bound.
    cpus = max(os.cpu_count() or 1, 2)  # two share one core harmlessly
    if value > cpus:
        raise ValueError(f"{value} processes exceed this machine's {cpus} CPUs (each holds a "
                         f"copy of the model); use at most {cpus}")
    return value


Processes = Annotated[int, Field(ge=1, description="an integer >= 1"),
                      AfterValidator(_at_most_cpus)]

DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _plain(value: str, what: str = "name") -> str:
    from qcal.fsio import plain_name

    try:
        return plain_name(value, what)
    except ConfigError as err:
        raise ValueError(str(err)) from None


def plain_list(text: str | None, what: str) -> list[str]:
    """A comma-separated list of plain names (languages, tasks): each checked."""
    return [_plain(x.strip(), what) for x in (text or "").split(",") if x.strip()]


def check_device(value: str) -> str:
    """A device string that names a device this machine has (`cuda` without CUDA is refused
    here, before the model loads)."""
    if not DEVICE.match(str(value).strip().lower()):
        raise ValueError(f"{value!r} is not a device; use cpu, cuda, cuda:N or auto")
    from qcal.devices import resolve_device

    resolve_device(value)  # its ConfigError is a ValueError: pydantic reports it
    return value


Device = Annotated[str, AfterValidator(check_device)]
PlainName = Annotated[str, AfterValidator(_plain)]


def check_source(spec: str) -> str:
    """A text source is a path that exists, hf:<dataset>, or a plain corpus/set name: never a
    name that climbs out of the corpus folder (`../../x`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("a source is a packaged corpus name, a .txt/.jsonl path or hf:<name>")
    if not spec.startswith("hf:"):
        _refuse_special(Path(spec))
    if spec.startswith("hf:") or Path(spec).expanduser().exists():
        return spec
    if Path(spec).suffix.lower() in (".txt", ".jsonl", ".json", ".md", ".parquet"):
        raise ValueError(f"file {spec} does not exist; give an existing .txt/.jsonl file")
    _plain(spec, "corpus name")
    return spec


Source = Annotated[str, AfterValidator(check_source)]


def check_chat_source(spec: str, flag: str) -> None:
    """--chat renders records' `messages`: only a JSONL/Parquet file or a dataset folder has
    records. Plain text, a packaged corpus, an hf: dataset (read by --text-field) or a saved
    calibration set (already tokens) would ignore it while the manifest said `chat: true`."""
    path = Path(spec).expanduser()
    if spec.startswith("hf:"):
        why = "hf: datasets are read by --text-field"
    elif path.is_file() and path.suffix.lower() not in (".jsonl", ".json", ".parquet"):
        why = f"{spec} is plain text, with no records"
    elif path.is_dir() and (path / "manifest.json").is_file():
        why = f"{spec} is a saved calibration set (already tokens)"
    elif not path.exists():
        why = f"{spec} is a packaged corpus or a saved set, not chat records"
    else:
        return
    raise ValueError(f"--chat renders the 'messages' of chat records, and {why}: drop --chat, "
                     f"or give {flag} a .jsonl/.parquet file or a dataset folder of chats")


def check_selector(spec: str) -> str:
    """Languages named inside a selector (ml:<lang>, mix:<lang>=w) are plain names."""
    head, _, arg = spec.strip().partition(":")
    if not head:
        raise ValueError("a selector needs a name, e.g. random, zipf, ml:de or mix:uniform")
    if head in ("ml", "mix"):
        for part in arg.split(","):
            lang = part.partition("=")[0].strip()
            if lang:
                _plain(lang, "language")
    if head == "self":  # its generation settings, before any model loads
        from qcal.calib.self_gen import parse_self
        from qcal.errors import ConfigError

        try:
            parse_self(spec.strip())
        except ConfigError as err:
            raise ValueError(str(err)) from None
    return spec


Selector = Annotated[str, AfterValidator(check_selector)]


def selector_langs(spec: str | None) -> list[str]:
    """Languages a selector names itself: ml:de,fr and mix:en=0.5,de=0.5 (not mix:uniform)."""
    head, _, arg = (spec or "").strip().partition(":")
    parts = [p.strip() for p in arg.split(",") if p.strip()]
    if head == "ml":
        return parts
    if head == "mix":
        return [p.partition("=")[0].strip() for p in parts if "=" in p]
    return []


def _special_kind(path: Path) -> str | None:
    """'a FIFO', 'a socket' or 'a device' for such a path (reading one blocks or never ends:
    /dev/zero, a named pipe), by stat alone; None otherwise."""
    import stat

    try:
        mode = path.expanduser().stat().st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None


def _refuse_special(path: Path) -> None:
    kind = _special_kind(Path(path))
    if kind:
        raise ValueError(f"{path} is {kind}, not a regular file (reading it would block or "
                         "never end); give a file")


def existing_file(path: Path) -> Path:
    _refuse_special(path)
    if not Path(path).expanduser().is_file():
        raise ValueError(f"file {path} does not exist; give the path of an existing file")
    return path


def existing_dir(path: Path) -> Path:
    if not Path(path).expanduser().is_dir():
        raise ValueError(f"directory {path} does not exist; give an existing directory")
    return path


def check_regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as err:
        raise ValueError(f"is not a regular expression ({err}); e.g. 'lm_head|.*gate$'") from None
    return pattern


def check_bytes(text: str) -> str:
    """A size such as 4GiB, 500MB or 1073741824 (kept as written; ByteSize reads it)."""
    from pydantic import ByteSize, TypeAdapter

    try:
        size = TypeAdapter(ByteSize).validate_python(text)
    except ValueError:
        raise ValueError("is not a size; write e.g. 4GiB, 500MB or a number of bytes") from None
    if size <= 0:
        raise ValueError("must be a positive size, e.g. 4GiB")
    return text


# For options still to come (`--ignore REGEX`, `--max-memory 4GiB`): one field line each.
def check_scheme_override(text: str) -> str:
    """'REGEX=bits:B,group:G[,sym:true|false]' or 'REGEX=skip' (qcal.config's parser)."""
    from qcal.config import parse_scheme_override
    from qcal.errors import ConfigError

    try:
        parse_scheme_override(text)
    except ConfigError as err:
        raise ValueError(str(err).removeprefix(f"--scheme-override {text!r}: ")) from None
    return text


def check_rotation(text: str) -> str:
    """'hadamard' or 'hadamard:SEED' (qcal.run_config.Rotation's parser)."""
    from qcal.errors import ConfigError
    from qcal.run_config import Rotation

    try:
        Rotation.parse(text)
    except ConfigError as err:
        raise ValueError(str(err)) from None
    return text


Regex = Annotated[str, AfterValidator(check_regex)]
RotationText = Annotated[str, AfterValidator(check_rotation), Field(max_length=64)]
SchemeOverrideText = Annotated[str, AfterValidator(check_scheme_override)]
Size = Annotated[str, AfterValidator(check_bytes)]
ExistingFile = Annotated[Path, AfterValidator(existing_file)]
ExistingDir = Annotated[Path, AfterValidator(existing_dir)]


class Options(BaseModel):
    """Base of every schema model: unknown fields are errors, a validated model is frozen,
    and booleans are strict (`Flag`): nothing is coerced into one."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


def did_you_mean(word: str, known: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def _allowed(model: type[BaseModel], field: str) -> str:
    info = model.model_fields.get(field)
    if info is None:
        return ""
    bits = [m.description for m in info.metadata if getattr(m, "description", None)]
    if info.description:
        bits.append(info.description)
    return bits[0] if bits else ""


def _example(model: type[BaseModel], field: str) -> Any:
    info = model.model_fields.get(field)
    if info is None:
        return None
    for m in [info, *info.metadata]:
        examples = getattr(m, "examples", None)
        if examples:
            return examples[0]
    default = info.default
    return None if default is None or isinstance(default, (bool, dict, list, tuple)) else default


BOUNDS = {"ge": ">= {}", "gt": "> {}", "le": "<= {}", "lt": "< {}"}


def error_line(err: ValidationError, model: type[BaseModel], label: Any, show: Any = str,
               yaml: bool = False) -> str:
    """The first problem of `err` as one line: which field, which value, what is allowed, and
    the fix. `label(field)` spells the field as the user wrote it (`--seed`, `grid key seed`);
    `show(value)` the value (the CLI's are strings; a YAML's type matters, so repr there)."""
    errors = err.errors(include_url=False)
    first = errors[0]
    raw_show = show

    def show(value: Any) -> str:  # noqa: F811  (a megabyte-long value is not echoed whole)
        text = str(raw_show(value))
        return text if len(text) <= 80 else text[:80] + "..."

    if isinstance(first.get("input"), list):  # an axis given as a list: the bad element,
        # else what is wrong with the list (too long) rather than that it is no number
        first = max(errors, key=lambda e: (len(e.get("loc", ())),
                                           not str(e.get("type", "")).endswith("_type")))
    loc = [str(x) for x in first.get("loc", ())]
    field = loc[0] if loc else ""
    where = label(field)
    value = first.get("input")
    msg = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden":
        known = sorted(model.model_fields)
        return f"{where} is not a known setting; {did_you_mean(field, known)}known: {', '.join(known)}"
    if msg.startswith(("Value error, ", "Assertion failed, ")):
        text = msg.split(", ", 1)[1]
        if not field or text.startswith(where):
            return text
        return f"{where} {show(value)}: {text}"
    msg = msg[0].lower() + msg[1:]
    allowed = _allowed(model, field)
    ctx = first.get("ctx") or {}
    if first.get("type") == "literal_error" and isinstance(value, str):
        choices = [c.strip(" '") for c in str(ctx.get("expected", "")).replace(" or ", ",").split(",")]
        msg = f"{did_you_mean(value, choices)}choose one of {', '.join(c for c in choices if c)}"
        return f"{where} {show(value)} is not a choice; {msg}"
    if not allowed:
        allowed = " and ".join(BOUNDS[k].format(v) for k, v in ctx.items() if k in BOUNDS)
    example = _example(model, field)
    bound = next((v for k, v in ctx.items() if k in ("ge", "le")), None)
    if example is None and bound is not None:
        example = bound
    spelled = f"{field}: {example}" if yaml else f"{label(field)} {example}"
    fix = f"; e.g. {spelled}" if example is not None else ""
    return (f"{where} {show(value)} is invalid ({msg})"
            + (f"; allowed: {allowed}" if allowed else "") + fix)


def validate(model: type[BaseModel], data: dict[str, Any], label: Any,
             show: Any = str, yaml: bool = False, strict: bool = False) -> BaseModel:
    """`model(**data)` or a ConfigError with one line naming field, value, range and fix;
    `strict`: no coercion ("12" is no count: the Python API's values are typed)."""
    try:
        return model.model_validate(data, strict=strict or None)
    except ValidationError as err:
        raise ConfigError(error_line(err, model, label, show, yaml)) from None
