"""Models bigger than memory (issue 36): streamed layers, sharded output, resume, no float copy.

A tiny random Llama stored in bf16 and sharded into several safetensors files stands in
for a big model. Float weights are counted where they are materialized; checkpoints of
the streamed path are compared byte for byte with the full-load path's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import nn

from qcal.cli import main
from qcal.config import AWQConfig, GPTQConfig, QuantScheme, RTNConfig
from qcal.methods.autoround import AutoRoundConfig
from qcal.methods.gptaq import GPTAQConfig
from qcal.methods.hqq import HQQConfig
from qcal.methods.rtn_imatrix import RTNImatrixConfig
from qcal.methods.rtn_mse import RTNMSEConfig
from qcal.model import offload, stream
from qcal.model.shards import INDEX_NAME
from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration
LAYERS = 3
CONFIGS = {"rtn": RTNConfig(QuantScheme(4, 32)), "gptq": GPTQConfig(QuantScheme(4, 32)),
           "awq": AWQConfig(QuantScheme(4, 32)),
           "rtn-mse": RTNMSEConfig(QuantScheme(4, 32), mse_grid=20),
           "hqq": HQQConfig(QuantScheme(4, 32), iters=5),
           "rtn-imatrix": RTNImatrixConfig(QuantScheme(4, 32), mse_grid=20),
           "gptaq": GPTAQConfig(QuantScheme(4, 32)),
           "autoround": AutoRoundConfig(QuantScheme(4, 32), iters=3, batch_size=2)}


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 decoder layers in bf16, cut into several shards with the standard index."""
    from transformers import AutoModelForCausalLM

    from qcal.model.tiny import build_tiny_llama

    base = tmp_path_factory.mktemp("big")
    src = build_tiny_llama(base / "src", layers=LAYERS)
    out = base / "sharded"
    net = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    net.save_pretrained(str(out), max_shard_size="150KB")
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, out / f.name)
    assert len(list(out.glob("*.safetensors"))) >= 3 and (out / INDEX_NAME).is_file()
    return out


@pytest.fixture(scope="module")
def calib_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text("\n\n".join(stdlib_text()[:60]), encoding="utf-8")
    return path


def _quantize(model: Path, method: str, out: Path, calib: Path, *extra: str, code: int = 0) -> None:
    args = ["quantize", "--model", str(model), "--method", method, "--group-size", "32",
            "--device", "cpu", "-o", str(out)]
    if method != "rtn":
        args += ["--calib", str(calib), "--nsamples", "4", "--seqlen", "32"]
    result = main([*args, *extra])
    assert result == code if code == 0 else result != 0


def _tensors(out: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            state.update({k: handle.get_tensor(k) for k in handle.keys()})  # noqa: SIM118
    return state


def _materialized_layers(model: nn.Module) -> int:
    """Decoder layers that hold any float tensor off the meta device."""
    return sum(any(t.is_floating_point() and not t.is_meta
                   for t in [*layer.parameters(), *layer.buffers()])
               for layer in model.model.layers)


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq", "rtn-imatrix"])
def test_quantize_holds_one_float_layer_at_a_time(sharded_model: Path, calib_text: Path,
                                                  tmp_path: Path, method: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))  # rtn-imatrix's energies
    models: list[nn.Module] = []
    seen: list[int] = []
    build, load = stream.build_skeleton, offload.DiskWeights._load

    def recording_build(*args: Any, **kwargs: Any) -> nn.Module:
        models.append(build(*args, **kwargs))
        seen.append(_materialized_layers(models[-1]))
        return models[-1]

    def counting_load(self: offload.DiskWeights, *args: Any, **kwargs: Any) -> int:
        n = load(self, *args, **kwargs)
        seen.extend(_materialized_layers(m) for m in models)
        return n

    monkeypatch.setattr(stream, "build_skeleton", recording_build)
    monkeypatch.setattr(offload.DiskWeights, "_load", counting_load)
    _quantize(sharded_model, method, tmp_path / "q", calib_text)
    assert len(models) == 1 and seen[0] == 0  # the skeleton holds no layer
    assert len(seen) >= 1 + LAYERS  # every layer was read through DiskWeights
    assert max(seen) == 1  # ... and each was freed before the next one was read
    assert _materialized_layers(models[0]) == 0
    # The embeddings and final norm are freed too once layer 0's inputs exist (an 8B
    # embedding is 0.8 GB in float32); the checkpoint reads them from the files.
    assert all(p.is_meta for p in models[0].parameters())


@pytest.mark.parametrize("method", list(CONFIGS))
def test_streamed_checkpoint_is_byte_identical_to_full_load(sharded_model: Path, tmp_path: Path,
                                                            method: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.methods import RunOptions
    from qcal.run import quantize_model_dir

    calib = torch.randint(0, 400, (4, 32), generator=torch.Generator().manual_seed(0))
    calib = None if method in ("rtn", "rtn-mse", "hqq") else calib
    work = tmp_path / "streamed.work"
    work.mkdir()
    # With a work dir the model streams; without one it is the full load of qcal before
    # issue 36 (whole model in memory, one save_checkpoint).
    for out, opts in ((tmp_path / "streamed", RunOptions(device="cpu", progress=False,
                                                         work_dir=work)),
                      (tmp_path / "full", RunOptions(device="cpu", progress=False))):
        # Each run measures rtn-imatrix's energies itself (no cache shared between them).
        monkeypatch.setenv("QCAL_RUNS_DIR", str(out) + ".runs")
        quantize_model_dir(sharded_model, method, CONFIGS[method], out, calib, opts=opts)
    assert (work / "layer_0000.safetensors").is_file()  # the streamed run did stream
    digest = [hashlib.sha256((tmp_path / d / "model.safetensors").read_bytes()).hexdigest()
              for d in ("streamed", "full")]
    assert digest[0] == digest[1]


def test_sharded_output_loads_in_qcal_and_transformers(sharded_model: Path, tmp_path: Path,
                                                       calib_text: Path) -> None:
    from transformers import AutoModelForCausalLM

    from qcal.model.loading import load_model

    one, many = tmp_path / "one", tmp_path / "many"
    for out, extra in ((one, ()), (many, ("--shard-size", "40KB"))):
        _quantize(sharded_model, "rtn", out, calib_text, "--sym", "--format",
                  "compressed-tensors", *extra)
    index = json.loads((many / INDEX_NAME).read_text())
    shards = sorted(p.name for p in many.glob("model-*.safetensors"))
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    assert not (one / INDEX_NAME).exists()
    a, b = _tensors(one), _tensors(many)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 400, (2, 16), generator=torch.Generator().manual_seed(0))
    ours = load_model(many)[0]
    theirs = AutoModelForCausalLM.from_pretrained(str(many), dtype=torch.float32)
    with torch.no_grad():
        x, y = ours(ids).logits, theirs(ids).logits
        assert torch.equal(x, load_model(one)[0](ids).logits)
    assert float((x - y).abs().max() / x.abs().max()) < 1e-3
    assert torch.equal(x.argmax(-1), y.argmax(-1))


def test_rtn_resume_continues_after_the_last_written_layer(sharded_model: Path, tmp_path: Path,
                                                           calib_text: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.methods import rtn

    _quantize(sharded_model, "rtn", tmp_path / "whole", calib_text)
    write = rtn.write_layer_state

    def dies_at_layer_2(work: Path, index: int, layer: nn.Module) -> None:
        if index == 2:
            raise KeyboardInterrupt
        write(work, index, layer)

    monkeypatch.setattr(rtn, "write_layer_state", dies_at_layer_2)
    _quantize(sharded_model, "rtn", tmp_path / "resumed", calib_text, code=1)
    progress = json.loads((tmp_path / "resumed.work" / "progress.json").read_text())
    assert progress["done"] == 1
    monkeypatch.setattr(rtn, "write_layer_state", write)
    reads: list[str] = []
    load = offload.DiskWeights.load_into
    monkeypatch.setattr(offload.DiskWeights, "load_into",
                        lambda self, m, prefix, *a, **k: reads.append(prefix) or load(self, m, prefix,
                                                                                      *a, **k))
    _quantize(sharded_model, "rtn", tmp_path / "resumed", calib_text, "--resume")
    assert reads == ["model.layers.2."]  # only the unfinished layer was read again
    assert (hashlib.sha256((tmp_path / "resumed" / "model.safetensors").read_bytes()).digest()
            == hashlib.sha256((tmp_path / "whole" / "model.safetensors").read_bytes()).digest())


def test_quantized_checkpoint_loads_without_a_float_copy(sharded_model: Path, tmp_path: Path,
                                                         calib_text: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from qcal.model.loading import load_model
    from qcal.packing.qlinear import QuantLinear

    _quantize(sharded_model, "rtn", tmp_path / "q", calib_text, "--shard-size", "40KB")
    made: list[bool] = []
    reset = nn.Linear.reset_parameters

    def recording_reset(self: nn.Linear) -> None:
        made.append(self.weight.is_meta)
        reset(self)

    monkeypatch.setattr(nn.Linear, "reset_parameters", recording_reset)
    net = load_model(tmp_path / "q")[0]
    assert made and all(made)  # every float linear was built on meta, never allocated
    layers = net.model.layers
    assert all(isinstance(m, QuantLinear) for layer in layers for m in layer.modules()
               if isinstance(m, (nn.Linear, QuantLinear)))
    assert not any(t.is_meta for t in [*net.parameters(), *net.buffers()])
