"""`--selector self`: calibration text the model writes itself (self-calibration: NAACL
2025 reports it competitive with real data; reasoning models calibrated on their own
traces, llm-compressor RFC 2974).

Each window starts from a prompt (a small built-in set per language, or the user's file,
one prompt per line), rendered through the model's chat template when it has one, and is
continued by seeded sampling (temperature, top-p) until it holds `seqlen` tokens; the end
of text is suppressed until then, so every window is full. Windows are generated a batch
at a time, each batch seeded from the set's seed and its index, so a run stopped part-way
(`work_dir` keeps finished batches as safetensors) resumes to the same set, and two runs
with the same settings give byte-identical sets. The manifest records the settings, the
model's identity (a digest of its files' content) and the generation cost.

    --selector self[:temperature=0.8,top_p=0.95,langs=en+de,prompts=FILE,batch=8]
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from qcal.calib.io import CalibSet
from qcal.calib.manifest import (
    MANIFEST_VERSION,
    content_digest,
    jsonable,
    token_statistics,
    tokenizer_info,
)
from qcal.errors import ConfigError

PROMPTS = {
    "en": ["Write a short article about how computers store information.",
           "Explain, step by step, how to set up a small home network.",
           "Tell a story about a lighthouse keeper.",
           "Describe the history of a city you know well."],
    "de": ["Schreibe einen kurzen Artikel darüber, wie Computer Informationen speichern.",
           "Erkläre Schritt für Schritt, wie man ein kleines Heimnetzwerk einrichtet."],
    "fr": ["Écris un court article sur la façon dont les ordinateurs stockent l'information.",
           "Explique étape par étape comment installer un petit réseau domestique."],
    "es": ["Escribe un artículo corto sobre cómo los ordenadores almacenan la información."],
    "ru": ["Напиши короткую статью о том, как компьютеры хранят информацию."],
    "zh": ["写一篇短文，介绍计算机如何存储信息。"],
    "ja": ["コンピューターが情報をどのように保存するかについて短い記事を書いてください。"],
    "ar": ["اكتب مقالة قصيرة عن كيفية تخزين أجهزة الكمبيوتر للمعلومات."],
}


@dataclasses.dataclass(frozen=True)
class SelfGeneration:
    temperature: float = 0.8
    top_p: float = 0.95
    langs: tuple[str, ...] = ("en",)
    prompts: str | None = None  # a file, one prompt per line
    batch: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.temperature <= 10:
            raise ConfigError(f"self: temperature={self.temperature} must lie in (0, 10]")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"self: top_p={self.top_p} must lie in (0, 1]")
        if not 1 <= self.batch <= 256:
            raise ConfigError(f"self: batch={self.batch} must lie in [1, 256]")
        unknown = [x for x in self.langs if x not in PROMPTS]
        if self.prompts is None and unknown:
            raise ConfigError(f"self: no built-in prompts in {unknown[0]!r}; use one of "
                              f"{sorted(PROMPTS)} or prompts=FILE")
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise ConfigError(f"self: prompts file {self.prompts} does not exist")

    def prompt_list(self) -> list[str]:
        if self.prompts is not None:
            lines = [x.strip() for x in Path(self.prompts).read_text(encoding="utf-8").split("\n")]
            lines = [x for x in lines if x]
            if not lines:
                raise ConfigError(f"self: prompts file {self.prompts} holds no prompt")
            return lines
        return [p for lang in self.langs for p in PROMPTS[lang]]


def parse_self(spec: str) -> SelfGeneration:
    """'self' or 'self:temperature=0.7,top_p=0.9,langs=en+de,prompts=FILE,batch=4'."""
    _, _, arg = spec.partition(":")
    fields: dict[str, Any] = {}
    for item in (x.strip() for x in arg.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"selector {spec!r}: write self:key=value,... (got {item!r})")
        try:
            if key in ("temperature", "top_p"):
                fields[key] = float(value)
            elif key == "batch":
                fields[key] = int(value)
            elif key == "langs":
                fields[key] = tuple(x for x in value.split("+") if x)
            elif key == "prompts":
                fields[key] = value
            else:
                raise ConfigError(f"selector {spec!r}: unknown option {key!r}; use temperature, "
                                  "top_p, langs, prompts or batch")
        except ValueError:
            raise ConfigError(f"selector {spec!r}: {key}={value!r} is not a number") from None
    return SelfGeneration(**fields)


def _prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return list(tokenizer(prompt)["input_ids"])


@torch.no_grad()
def _batch(model: Any, tokenizer: Any, prompts: list[list[int]], seqlen: int, seed: int,
           gen: SelfGeneration) -> torch.Tensor:
    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    if longest >= seqlen:
        raise ConfigError(f"a prompt of {longest} tokens leaves no room in a {seqlen}-token "
                          "window; use a larger --seqlen or shorter prompts")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):  # left padding: every row's continuation starts together
        ids[r, longest - len(p):] = torch.tensor(p)
        mask[r, longest - len(p):] = 1
    new = seqlen - min(len(p) for p in prompts)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         do_sample=True, temperature=gen.temperature, top_p=gen.top_p, top_k=0,
                         max_new_tokens=new, min_new_tokens=new, pad_token_id=pad)
    rows = [out[r, longest - len(p):][:seqlen].cpu() for r, p in enumerate(prompts)]
    return torch.stack(rows)


def generate_calib_set(model: Any, tokenizer: Any, n: int, seqlen: int, seed: int,
                       spec: str, model_identity: str, work_dir: Path | None = None,
                       progress: bool = True) -> CalibSet:
    """`n` windows of `seqlen` tokens written by `model` (see the module docstring)."""
    gen = parse_self(spec)
    prompts = gen.prompt_list()
    encoded = [_prompt_ids(tokenizer, p) for p in prompts]
    started, parts = time.perf_counter(), []
    batches = range(0, n, gen.batch)
    for b, start in enumerate(tqdm(batches, desc="self-generate", disable=not progress)):
        rows = [encoded[(start + r) % len(encoded)] for r in range(min(gen.batch, n - start))]
        done = work_dir / f"self-batch{b:05d}.safetensors" if work_dir is not None else None
        if done is not None and done.is_file():
            part = load_file(done)["ids"]
        else:
            part = _batch(model, tokenizer, rows, seqlen, seed * 100_003 + b, gen)
            if done is not None:
                done.parent.mkdir(parents=True, exist_ok=True)
                save_file({"ids": part.contiguous()}, str(done))
        parts.append(part)
    ids = torch.cat(parts).to(torch.long)
    langs = [gen.langs[0] if gen.prompts is None and len(gen.langs) == 1 else "?" for _ in range(n)]
    params = jsonable({**dataclasses.asdict(gen), "model": model_identity,
                       "prompts_digest": hashlib.sha256("\n".join(prompts).encode()).hexdigest(),
                       "chat_template": bool(getattr(tokenizer, "chat_template", None))})
    special = [t for t in getattr(tokenizer, "all_special_ids", []) or [] if t is not None]
    manifest = {
        "format_version": MANIFEST_VERSION, "selector": "self", "params": params, "seed": seed,
        "nsamples": n, "seqlen": seqlen, "source": "self", "tokenizer": tokenizer_info(tokenizer),
        "samples": [{"lang": langs[i], "documents": [f"self/{i}"], "prompt":
                     prompts[i % len(prompts)]} for i in range(n)],
        "statistics": token_statistics(ids, langs, special),
        "selection": {"generation_seconds": round(time.perf_counter() - started, 2)},
        "digest": content_digest(ids, "self", params, seed),
    }
    return CalibSet(ids, jsonable(manifest))


def self_calib_set(tokenizer: Any, n: int, seqlen: int, seed: int, spec: str,
                   model: Any = None) -> CalibSet:
    """The self-generated set of the float model in the tokenizer's directory (or `model`),
    its finished batches kept under runs/self_gen/<settings key> until the set is done."""
    from qcal.model.loading import load_model
    from qcal.packing.checkpoint import is_quantized_checkpoint
    from qcal.paths import runs_dir

    parse_self(spec)  # bad settings fail before the model loads
    path = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if model is None:
        if not path.is_dir():
            raise ConfigError(f"--selector self needs the model's directory; {path} is not one")
        if is_quantized_checkpoint(path):
            raise ConfigError(f"{path} is a quantized checkpoint; --selector self generates with "
                              "the float model")
        model = load_model(path)[0]
    identity = _identity(path) if path.is_dir() else "in-memory"
    key = hashlib.sha256(repr((spec, n, seqlen, seed, identity)).encode()).hexdigest()[:16]
    work = runs_dir() / "self_gen" / key
    calib = generate_calib_set(model, tokenizer, n, seqlen, seed, spec, identity, work)
    for done in work.glob("self-batch*.safetensors"):
        done.unlink()
    return calib


def _identity(model_dir: Path) -> str:
    """A digest of the model's weight files' content (qcal.eval.score_store's rule)."""
    from qcal.eval.score_store import model_identity

    return model_identity(model_dir)
