"""A tiny random Llama built from a config, with a small BPE tokenizer: no download.

Used by tests and as a smoke-test target. The tokenizer is trained on stdlib
docstrings, real English that every Python install carries.
"""

from __future__ import annotations

import importlib
from pathlib import Path

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
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

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out))
    return out
