"""`--device` on every command that computes, and layer-wise placement.

This machine has no GPU, so placement is checked by recording every `.to()` of the
decoder layers and the prelude modules while GPTQ runs with an explicit device string
("cpu:0", a different string for the same CPU): only the prelude visits the device to
capture layer 0's inputs, exactly one decoder layer is there while it is quantized, and
each goes home afterwards. scripts/gpu_check.sh repeats the real thing on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from qcal.cli import main
from qcal.config import GPTQConfig, QuantScheme
from qcal.devices import resolve_device
from qcal.errors import ConfigError
from qcal.methods import RunOptions, gptq_runner
from qcal.model.arch import decoder_layers, get_module
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for

pytestmark = pytest.mark.integration
TARGET = "cpu:0"


def test_resolve_device() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("CPU") == "cpu"
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("gpu please")
    with pytest.raises(ConfigError, match="not supported"):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command", [
    ["quantize", "--method", "rtn"], ["eval", "--text", "x.txt"], ["compare", "--methods", "rtn"],
    ["calib", "build", "--selector", "perplexity"],
])
def test_every_computing_command_takes_device(command: list[str], tiny_model_dir: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    argv = [*command, "--model", str(tiny_model_dir), "--device", "cuda"]
    assert main(argv) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_layerwise_placement(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = load_model(tiny_model_dir)
    arch = arch_for(model)
    layers = list(decoder_layers(model, arch))
    prelude = [get_module(model, n) for n in arch.prelude_modules if _has(model, n)]
    watched = {id(m): f"layer{i}" for i, m in enumerate(layers)}
    watched.update({id(m): f"prelude{i}" for i, m in enumerate(prelude)})
    where: dict[str, str] = {name: "cpu" for name in watched.values()}
    events: list[tuple[str, str]] = []
    real_to = nn.Module.to

    def recording_to(self: nn.Module, *args, **kwargs):  # noqa: ANN202
        name = watched.get(id(self))
        if name is not None:
            device = str(args[0] if args else kwargs.get("device"))
            where[name] = device
            events.append((name, device))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", recording_to)
    snapshots: list[dict[str, str]] = []
    real_layer = gptq_runner.quantize_layer_gptq

    def snapshot(layer, inputs, steps, cfg, prefix="", device="cpu", *rest):  # noqa: ANN001, ANN202
        assert device == TARGET
        snapshots.append(dict(where))
        return real_layer(layer, inputs, steps, cfg, prefix, device, *rest)

    monkeypatch.setattr(gptq_runner, "quantize_layer_gptq", snapshot)
    calib = torch.randint(0, model.config.vocab_size, (4, 32))
    gptq_runner.run_gptq(model, GPTQConfig(QuantScheme(4, 32)), calib,
                         RunOptions(device=TARGET, progress=False, log=lambda _: None))

    assert prelude and all((f"prelude{i}", TARGET) in events for i in range(len(prelude)))
    assert len(snapshots) == len(layers)
    for index, snap in enumerate(snapshots):
        on_device = sorted(name for name, dev in snap.items() if dev == TARGET)
        assert on_device == [f"layer{index}"], (index, snap)  # one layer, prelude back home
    assert all(dev == "cpu" for dev in where.values()), where  # everything home at the end


def _has(model: nn.Module, name: str) -> bool:
    try:
        get_module(model, name)
        return True
    except AttributeError:
        return False
