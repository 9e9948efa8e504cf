"""Tiny random Llama and Gemma3 models built from a config, with a small BPE tokenizer:
no download.

Used by tests and as smoke-test targets. The tokenizer is trained on stdlib
docstrings, real English that every Python install carries.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

_DOC_MODULES = ("json", "pathlib", "argparse", "collections", "functools", "itertools",
                "subprocess", "logging", "shutil", "string", "textwrap", "unittest")


def stdlib_text() -> list[str]:
    docs: list[str] = []
    for name in _DOC_MODULES:
        mod = importlib.import_module(name)
        for obj in [mod, *vars(mod).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 80:
                docs.append(doc.strip())
    return docs


def _train_tokenizer(out: Path, vocab_size: int) -> tuple[Any, int]:
    """A byte-level BPE trained on stdlib docstrings, saved to `out`: (tokenizer, vocab size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(stdlib_text(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(str(out))
    return tok, bpe.get_vocab_size()


def build_tiny_llama(
    out_dir: Path | str,
    vocab_size: int = 512,
    hidden: int = 128,
    layers: int = 2,
    intermediate: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Write a random LlamaForCausalLM + fast BPE tokenizer to `out_dir` and return it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    tok, vocab = _train_tokenizer(out, vocab_size)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out))
    return out


def build_tiny_gemma3(
    out_dir: Path | str,
    vocab_size: int = 512,
    hidden: int = 64,
    intermediate: int = 128,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 64,
    sliding_window: int = 8,
    seed: int = 0,
) -> Path:
    """Write a random Gemma3ForCausalLM (one sliding-window layer, then one global layer)
    + fast BPE tokenizer to `out_dir` and return it.

    Shaped like Gemma-3-270M in what can break quantization: grouped-query attention whose
    heads are wider than hidden/heads (q/o_proj are 2x hidden), q_norm/k_norm, four
    (1 + w) norms per layer, a short sliding window (so calibration sequences of 32 tokens
    see different masks and rotary tables in the two layers) and tied, scaled embeddings.
    """
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out = Path(out_dir)
    tok, vocab = _train_tokenizer(out, vocab_size)
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        # Gemma initialises its norms at w = 0 (scale 1 + w = 1); real checkpoints are far
        # from that, and a fold that forgets the "1 +" must show in the tests.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    model.save_pretrained(str(out))
    return out


# Tiny configs of common decoder-only families (2 layers, hidden 64): what the architecture
# tests and `qcal report --study architectures` quantize. Keys are transformers config class names.
_COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
TINY_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", _COMMON),
    "mistral": ("MistralConfig", _COMMON),
    "qwen2": ("Qwen2Config", _COMMON),
    "qwen3": ("Qwen3Config", {**_COMMON, "head_dim": 16}),
    "gemma2": ("Gemma2Config", {**_COMMON, "head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", {**_COMMON, "head_dim": 16, "sliding_window": 8}),
    "phi3": ("Phi3Config", _COMMON),
    "phi": ("PhiConfig", _COMMON),
    "opt": ("OPTConfig", {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "word_embed_proj_dim": 64,
                          "max_position_embeddings": 256}),
    "gpt_neox": ("GPTNeoXConfig", {"hidden_size": 64, "intermediate_size": 128,
                                   "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "max_position_embeddings": 256}),
    "falcon": ("FalconConfig", {"hidden_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "new_decoder_architecture": False,
                                "multi_query": True}),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}),
    "olmo2": ("Olmo2Config", _COMMON),
    "stablelm": ("StableLmConfig", _COMMON),
    "granite": ("GraniteConfig", _COMMON),
    "mixtral": ("MixtralConfig", {**_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", {**_COMMON, "head_dim": 16, "num_experts": 4,
                                     "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                     "decoder_sparse_step": 1}),
}


def build_tiny_family(family: str, out_dir: Path | str, outliers: bool = True,
                      seed: int = 0) -> Path:
    """Write a random 2-layer model of `family` (a TINY_FAMILIES key) + BPE tokenizer.

    Like trained models in what breaks a wrong AWQ fold or a missed linear: norm weights far
    from their init (scale factors in [0.5, 1.5], as w or 1 + w) and, with `outliers`, four
    embedding channels 8x larger than the rest (the high-magnitude input channels AWQ exists
    for)."""
    import transformers

    cls_name, kwargs = TINY_FAMILIES[family]
    out = Path(out_dir)
    tok, vocab = _train_tokenizer(out, 512)
    config = getattr(transformers, cls_name)(
        vocab_size=vocab, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name.lower() or name.endswith(("ln_1.weight",
                                                                               "ln_2.weight")):
                zero_centred = float(param.detach().abs().mean()) < 1e-6  # a (1 + w) norm
                param.uniform_(-0.5, 0.5) if zero_centred else param.uniform_(0.5, 1.5)
        if outliers:
            emb = model.get_input_embeddings().weight
            emb[:, :4] *= 8.0
    model.save_pretrained(str(out))
    return out
