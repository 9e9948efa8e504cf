"""GPTAQ end to end on tiny models: the driver's float stream is the float model's hidden
states at every layer; alpha 0 is GPTQ bit for bit (so every difference comes from the
asymmetry term); every checkpoint format loads back with the in-memory run's codes and
logits; an interrupted run resumes to the uninterrupted result (float stream included);
and a second architecture family (Gemma3: sliding-window layers, per-layer rotary) runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from method_cases import PROMPTS, equal_states, state, token_ids

from qcal.cli import main
from qcal.config import GPTQConfig, QuantScheme
from qcal.methods import METHODS, RunOptions, gptq_runner
from qcal.methods.gptaq import GPTAQConfig, run_gptaq
from qcal.methods.gptq_runner import run_gptq
from qcal.model.arch import decoder_layers
from qcal.model.capture import LayerInputs
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.model.sequential import sequential_quantize
from qcal.model.tiny import build_tiny_family, stdlib_text
from qcal.packing.checkpoint import quant_modules
from qcal.packing.checkpoint_load import load_checkpoint
from qcal.packing.formats import codes_of

pytestmark = pytest.mark.integration

CFG = GPTAQConfig(QuantScheme(3, 32), desc_act=True)
QUIET = RunOptions(progress=False, log=lambda _: None)


def _ids(model_dir: Path, rows: int = 8, seqlen: int = 48) -> torch.Tensor:
    return token_ids(model_dir, rows, seqlen)


@pytest.fixture(scope="module")
def calib(tiny_model_dir: Path) -> torch.Tensor:
    return _ids(tiny_model_dir)


def test_the_reference_stream_is_the_float_model(tiny_model_dir: Path,
                                                 calib: torch.Tensor) -> None:
    net, _, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        expected = net(calib, output_hidden_states=True).hidden_states
    seen: dict[int, list[torch.Tensor]] = {}

    def perturb(index: int, layer: torch.nn.Module, inputs: LayerInputs) -> dict:
        assert inputs.reference is not None and inputs.reference.layer is not layer
        seen[index] = [h.clone() for h in inputs.reference.hidden]
        with torch.no_grad():  # the quantized stream drifts; the float one must not
            for p in layer.parameters():
                p.mul_(0.5)
        return {}

    sequential_quantize(net, arch_for(net), calib, perturb, batch_size=3, progress=False,
                        reference_stream=True)
    assert sorted(seen) == list(range(len(decoder_layers(net, arch_for(net)))))
    for index, batches in seen.items():
        torch.testing.assert_close(torch.cat(batches), expected[index], rtol=1e-5, atol=1e-5)


def test_alpha_zero_is_gptq_bit_for_bit(tiny_model_dir: Path, calib: torch.Tensor) -> None:
    gptq, _, _ = load_model(tiny_model_dir)
    gptq_losses = run_gptq(gptq, GPTQConfig(CFG.scheme, desc_act=True), calib, QUIET)
    zero, _, _ = load_model(tiny_model_dir)
    zero_losses = run_gptaq(zero, dataclasses.replace(CFG, alpha=0.0), calib, QUIET)
    assert zero_losses == gptq_losses and equal_states(state(zero), state(gptq))
    # With the correction on, the first step of layer 0 still sees equal streams (both
    # models feed layer 0 the same embeddings), so only later linears move.
    full, _, _ = load_model(tiny_model_dir)
    losses = run_gptaq(full, CFG, calib, QUIET)
    assert losses["model.layers.0.self_attn.q_proj"] == gptq_losses["model.layers.0.self_attn.q_proj"]
    assert losses != gptq_losses


def _in_memory(model_dir: Path, calib: torch.Tensor, cfg: GPTAQConfig) -> torch.nn.Module:
    net, _, _ = load_model(model_dir)
    METHODS.get("gptaq").run(net, cfg, calib, QUIET)
    return net


# What each layout stores: compressed-tensors needs act-order's groups static, AWQ's layout
# 4 bits and no act-order.
FORMAT_CONFIGS = {"compressed-tensors": dataclasses.replace(CFG, static_groups=True),
                  "gptq": CFG, "gptq_v2": CFG,
                  "awq": GPTAQConfig(QuantScheme(4, 32))}


@pytest.mark.parametrize("fmt", list(FORMAT_CONFIGS))
def test_every_format_loads_back_with_the_in_memory_logits(tiny_model_dir: Path, tmp_path: Path,
                                                           calib: torch.Tensor, fmt: str) -> None:
    from qcal.run import quantize_model_dir

    out, cfg = tmp_path / fmt, FORMAT_CONFIGS[fmt]
    quantize_model_dir(tiny_model_dir, "gptaq", cfg, out, calib, opts=QUIET, fmt=fmt)
    back, ref = load_checkpoint(out), _in_memory(tiny_model_dir, calib, cfg)
    qa, qb = quant_modules(ref), quant_modules(back)
    assert qa.keys() == qb.keys() and len(qa) > 0
    for name in qa:
        assert torch.equal(codes_of(qa[name]).codes, codes_of(qb[name]).codes), name
    with torch.no_grad():
        torch.testing.assert_close(back(PROMPTS).logits, ref(PROMPTS).logits)


def test_cli_and_api_take_the_one_route(tiny_model_dir: Path, tmp_path: Path) -> None:
    import qcal

    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()))
    out = tmp_path / "cli"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptaq", "--desc-act",
                 "--static-groups", "--gptaq-alpha", "0.5", "--bits", "3", "--group-size", "32", "--calib",
                 str(text), "--nsamples", "6", "--seqlen", "40", "--device", "cpu",
                 "-o", str(out)]) == 0
    log = json.loads((out / "quant_log.json").read_text())
    assert log["recipe"]["method"]["type"] == "GPTAQConfig"
    assert log["recipe"]["method"]["alpha"] == 0.5
    api = tmp_path / "api"
    qcal.quantize(str(tiny_model_dir), method="gptaq", scheme={"bits": 3, "group_size": 32},
                  output=api, calib=str(text), nsamples=6, seqlen=40, desc_act=True,
                  static_groups=True, alpha=0.5)
    a, b = quant_modules(load_checkpoint(out)), quant_modules(load_checkpoint(api))
    assert a.keys() == b.keys()
    assert all(torch.equal(codes_of(a[n]).codes, codes_of(b[n]).codes) for n in a)


def test_awq_format_refuses_act_order_in_one_line(tiny_model_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptaq", "--desc-act",
                 "--format", "awq", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--desc-act" in err[0] and not out.exists()


def test_resume_continues_after_interruption(tiny_model_dir: Path, calib: torch.Tensor,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference, _, _ = load_model(tiny_model_dir)
    ref_losses = run_gptaq(reference, CFG, calib, QUIET)
    work = tmp_path / "work"
    real = gptq_runner.quantize_layer_gptq

    def interrupted(layer, inputs, steps, cfg, prefix="", *rest):  # type: ignore[no-untyped-def]
        if prefix.endswith(".1."):
            raise KeyboardInterrupt
        return real(layer, inputs, steps, cfg, prefix, *rest)

    monkeypatch.setattr(gptq_runner, "quantize_layer_gptq", interrupted)
    first, _, _ = load_model(tiny_model_dir)
    opts = RunOptions(progress=False, log=lambda _: None, work_dir=work,
                      weights_dir=tiny_model_dir)
    with pytest.raises(KeyboardInterrupt):
        run_gptaq(first, CFG, calib, opts)
    assert json.loads((work / "progress.json").read_text())["done"] == 0
    monkeypatch.setattr(gptq_runner, "quantize_layer_gptq", real)
    resumed, _, _ = load_model(tiny_model_dir)
    losses = run_gptaq(resumed, CFG, calib, dataclasses.replace(opts, resume=True))
    assert losses == pytest.approx(ref_losses)
    assert equal_states(state(resumed), state(reference))


def test_a_second_family_runs_and_stays_near_gptq(tmp_path: Path) -> None:
    model_dir = build_tiny_family("gemma3", tmp_path / "gemma3")
    ids = _ids(model_dir, rows=6, seqlen=40)
    gptq, _, _ = load_model(model_dir)
    gptq_losses = run_gptq(gptq, GPTQConfig(CFG.scheme, desc_act=True), ids, QUIET)
    zero, _, _ = load_model(model_dir)
    run_gptaq(zero, dataclasses.replace(CFG, alpha=0.0), ids, QUIET)
    assert equal_states(state(zero), state(gptq))
    net, _, _ = load_model(model_dir)
    losses = run_gptaq(net, CFG, ids, QUIET)
    assert losses.keys() == gptq_losses.keys()
    # Its own inputs are not what GPTAQ fits, but it must not wreck them either.
    assert sum(v for v in losses.values() if v) < 2 * sum(v for v in gptq_losses.values() if v)
