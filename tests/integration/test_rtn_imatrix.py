"""`--method rtn-imatrix` and GPTQ's `--imatrix-clip` on the tiny model: the importances are
the float model's E[x^2] per input channel (checked against a whole-model forward), kept in
the cache keyed by model and ids and reused by the next run whatever its scheme, and the
checkpoint holds the weighted search's codes in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.cli import main
from qcal.config import QuantScheme
from qcal.methods import METHODS, RunOptions, rtn_imatrix
from qcal.methods.rtn_imatrix import RTNImatrixConfig, energy_file
from qcal.methods.rtn_mse import RTNMSEConfig, mse_clip_quantize
from qcal.model.loading import load_model
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of

pytestmark = pytest.mark.integration
IDS = torch.randint(0, 400, (4, 32), generator=torch.Generator().manual_seed(0))


def _whole_model_energy(model_dir: Path) -> dict[str, torch.Tensor]:
    """E[x^2] per input channel of every linear, from forwards of the whole float model."""
    net, _, _ = load_model(model_dir)
    sums: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in net.model.layers.named_modules(prefix="model.layers"):
        if isinstance(module, torch.nn.Linear):
            def hook(mod, args, name=name):
                x = args[0].reshape(-1, args[0].shape[-1]).double().pow(2).sum(0)
                sums[name] = sums.get(name, 0) + x
            handles.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for row in IDS:
            net(row[None])
    for h in handles:
        h.remove()
    return {k: (v / IDS.numel()).float() for k, v in sums.items()}


def test_energies_are_the_float_models_and_are_reused(tiny_model_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QCAL_RUNS_DIR", str(tmp_path / "runs"))
    net, _, _ = load_model(tiny_model_dir)
    weights = {n: m.weight.detach().clone() for n, m in net.named_modules()
               if isinstance(m, torch.nn.Linear) and n.startswith("model.layers")}
    cfg = RTNImatrixConfig(QuantScheme(4, 32), mse_grid=20)
    METHODS.get("rtn-imatrix").run(net, cfg, IDS, RunOptions(progress=False))
    path = energy_file(net, IDS)
    assert path.is_file()
    from safetensors.torch import load_file

    saved, want = load_file(str(path)), _whole_model_energy(tiny_model_dir)
    assert saved.keys() == want.keys() == weights.keys()
    for name in want:
        torch.testing.assert_close(saved[name], want[name], rtol=1e-4, atol=1e-6)
    # The checkpointed codes are the weighted search's, with these importances.
    name = "model.layers.1.mlp.down_proj"
    ref = mse_clip_quantize(weights[name], RTNMSEConfig(QuantScheme(4, 32), mse_grid=20), name,
                            importance=saved[name])
    got = codes_of(net.get_submodule(name))
    assert torch.equal(got.codes, ref.codes)

    # Another scheme on the same model and ids: no second pass, the file is read.
    def no_pass(*args, **kwargs):
        raise AssertionError("the importances were measured again")

    monkeypatch.setattr(rtn_imatrix, "channel_energy", no_pass)
    again, _, _ = load_model(tiny_model_dir)
    METHODS.get("rtn-imatrix").run(again, RTNImatrixConfig(QuantScheme(3, 32), mse_grid=10),
                                   IDS, RunOptions(progress=False))
    other_ids = IDS.flip(1)
    with pytest.raises(AssertionError, match="measured again"):
        METHODS.get("rtn-imatrix").run(load_model(tiny_model_dir)[0], cfg, other_ids,
                                       RunOptions(progress=False))


@pytest.mark.parametrize("fmt", ["compressed-tensors", "gptq", "awq"])
def test_cli_checkpoint_in_every_format(home: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / fmt
    assert main(["quantize", "--model", str(home / "mymodel"), "--method", "rtn-imatrix",
                 "--group-size", "32", "--mse-grid", "10", "--calib", str(home / "calib.txt"),
                 "--nsamples", "4", "--seqlen", "32", "--device", "cpu", "--format", fmt,
                 "-o", str(out)]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["recipe"]["method"]["type"] == "RTNImatrixConfig"
    back = load_checkpoint(out)
    with torch.no_grad():
        assert torch.isfinite(back(IDS[:1]).logits).all()
    assert list((tmp_path / "runs" / "imatrix").glob("imatrix-*.safetensors"))


def test_search_flags_are_shared_and_refused_elsewhere(home: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["quantize", "--model", str(home / "mymodel"), "--method", "awq",
                 "--mse-grid", "10", "-o", str(out)]) == 2
    assert "--mse-grid is a rtn-mse/rtn-imatrix option" in capsys.readouterr().err
    assert not out.exists()


def test_gptq_imatrix_clip_runs_end_to_end(home: Path, tmp_path: Path) -> None:
    outs = {}
    for flag in ("--mse-clip", "--imatrix-clip"):
        out = outs[flag] = tmp_path / flag.strip("-")
        assert main(["quantize", "--model", str(home / "mymodel"), "--method", "gptq", flag,
                     "--bits", "3", "--group-size", "32", "--calib", str(home / "calib.txt"),
                     "--nsamples", "4", "--seqlen", "32", "--device", "cpu", "-o",
                     str(out)]) == 0
    log = json.loads((outs["--imatrix-clip"] / "quant_log.json").read_text())
    assert log["recipe"]["method"]["imatrix_clip"] is True
    a, b = (load_checkpoint(o) for o in outs.values())
    name = "model.layers.0.mlp.down_proj"
    assert not torch.equal(codes_of(a.get_submodule(name)).scales,
                           codes_of(b.get_submodule(name)).scales)
