"""A tiny Qwen2 written as a GGUF file, the way llama.cpp's converter lays one out: the
architecture's metadata keys, a byte-level BPE vocabulary with merges, a chat template and
F32 tensors under GGUF names. Provisioning tests convert it back and compare."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def build_tiny_qwen2(out_dir: Path, layers: int = 2) -> tuple[object, Path]:
    """(the random Qwen2ForCausalLM, the path of its GGUF): q/k/v biases and an untied head,
    as Qwen2.5-Coder-1.5B has."""
    import gguf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from qcal.model.tiny import _train_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    _, vocab_size = _train_tokenizer(out_dir / "tok", 512)
    spec = json.loads((out_dir / "tok" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 and nonzero biases, so a lost tensor shows
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0, 0.1)

    path = out_dir / "tiny-qwen2.gguf"
    writer = gguf.GGUFWriter(str(path), arch="qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t.startswith("<|") else gguf.TokenType.NORMAL
                            for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, layers)
    for key, tensor in model.state_dict().items():
        stem, _, suffix = key.rpartition(".")
        writer.add_tensor(f"{names.get_name(stem)}.{suffix}", tensor.numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, path
