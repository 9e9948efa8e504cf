"""AWQ on a tiny random Llama: folding keeps the layer's function, the search artifact
replays to identical weights, resume, the checkpoint round trip, the CLI, every selector."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from qcal.config import AWQConfig, QuantScheme
from qcal.errors import CheckpointError
from qcal.methods import RunOptions
from qcal.methods.awq_runner import (
    ARTIFACT_NAME,
    apply_awq_artifact,
    awq_quantize_model,
    load_artifact,
)
from qcal.methods.awq_search import fold_scale, group_applies
from qcal.model.arch import decoder_layers
from qcal.model.capture import capture_layer0_inputs, run_layer
from qcal.model.loading import load_model
from qcal.model.resolve import arch_for
from qcal.packing.qlinear import QuantLinear

pytestmark = pytest.mark.integration

# A small search grid keeps these tests fast; the defaults are covered by the unit tests.
FAST = AWQConfig(scheme=QuantScheme(4, 32), grid_points=5, clip_grid=10)


@pytest.fixture(scope="module")
def mha_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Llama without GQA (kv_heads == heads), so the v_proj -> o_proj group applies."""
    from qcal.model.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-mha"), heads=4, kv_heads=4)


def _calib(n: int = 4, seqlen: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 400, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def _quant_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.{b}": t for n, m in model.named_modules() if isinstance(m, QuantLinear)
            for b, t in m.named_buffers()}


def test_folding_random_scales_keeps_a_decoder_layer_unchanged(mha_model_dir: Path) -> None:
    model, _, _ = load_model(mha_model_dir)
    spec = arch_for(model)
    layer = decoder_layers(model, spec)[0]
    inputs = capture_layer0_inputs(model, spec, _calib(2, 32), batch_size=2)
    before = run_layer(layer, inputs)[0]
    gen = torch.Generator().manual_seed(1)
    applied = []
    for group in spec.scale_groups:
        if group_applies(layer, group):
            width = layer.get_submodule(group.linears[0]).in_features
            fold_scale(layer, group, torch.rand(width, generator=gen) * 3 + 0.1, spec.norm_offset)
            applied.append(group.prev_op)
    assert applied == ["input_layernorm", "self_attn.v_proj", "post_attention_layernorm", "mlp.up_proj"]
    after = run_layer(layer, inputs)[0]
    assert float((after - before).norm() / before.norm()) < 1e-5


def test_search_artifact_replays_to_identical_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, _, _ = load_model(tiny_model_dir)
    work = tmp_path / "work"
    losses, artifact = awq_quantize_model(model, FAST, _calib(), RunOptions(progress=False,
                                                                          work_dir=work))
    spec = arch_for(model)
    assert set(losses) == {f"model.layers.{i}.{n}" for i in range(2) for n in spec.linear_names}
    entry = artifact["layers"][0]
    # GQA tiny model (4 heads, 2 KV heads): v_proj -> o_proj is skipped.
    assert [g["prev_op"] for g in entry["scales"]] == ["input_layernorm", "post_attention_layernorm",
                                                       "mlp.up_proj"]
    assert all(g["loss"] <= g["rtn_loss"] for g in entry["scales"])
    assert set(entry["clips"]) == set(spec.linear_names) - set(spec.awq_clip_skip)
    assert (work / ARTIFACT_NAME).is_file()

    fresh, _, _ = load_model(tiny_model_dir)
    apply_awq_artifact(fresh, work / ARTIFACT_NAME)
    got, want = _quant_state(fresh), _quant_state(model)
    assert got.keys() == want.keys() and len(got) == 2 * 7 * 4
    for key in want:
        assert torch.equal(got[key], want[key]), key
    # Norms absorbed the scales too, so the replayed model computes the same function.
    ids = _calib(1, 16, seed=5)
    assert torch.allclose(fresh(ids).logits, model(ids).logits, atol=1e-5)


def test_replay_refuses_an_artifact_for_another_model(tiny_model_dir: Path, mha_model_dir: Path,
                                                      tmp_path: Path) -> None:
    model, _, _ = load_model(mha_model_dir)
    _, artifact = awq_quantize_model(model, FAST, _calib(2), RunOptions(progress=False))
    other, _, _ = load_model(tiny_model_dir)  # GQA: v_proj is 64 wide, the scale 128
    with pytest.raises(CheckpointError, match="different model"):
        apply_awq_artifact(other, artifact)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_artifact(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="reads only awq_search.safetensors"):
        load_artifact(tmp_path / "old.pt")


def test_resume_after_a_finished_run_rebuilds_the_artifact(tiny_model_dir: Path, tmp_path: Path) -> None:
    opts = RunOptions(progress=False, work_dir=tmp_path / "work")
    first, _, _ = load_model(tiny_model_dir)
    losses1, art1 = awq_quantize_model(first, FAST, _calib(), opts)
    second, _, _ = load_model(tiny_model_dir)
    losses2, art2 = awq_quantize_model(second, FAST, _calib(), RunOptions(
        progress=False, work_dir=tmp_path / "work", resume=True))
    assert losses2 == pytest.approx(losses1)
    for a, b in zip(art1["layers"], art2["layers"], strict=True):
        assert all(torch.equal(x["scale"], y["scale"]) for x, y in zip(a["scales"], b["scales"], strict=True))
    assert all(torch.equal(v, _quant_state(second)[k]) for k, v in _quant_state(first).items())


def test_cli_quantize_awq_writes_a_loadable_gptq_layout_checkpoint(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    from qcal.cli import main
    from qcal.model.tiny import stdlib_text

    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:40]), encoding="utf-8")
    out = tmp_path / "ckpt"
    rc = main(["quantize", "--model", str(tiny_model_dir), "--method", "awq", "--bits", "4",
               "--group-size", "64", "--calib", str(text), "--nsamples", "4", "--seqlen", "32",
               "-o", str(out)])
    assert rc == 0
    config = json.loads((out / "config.json").read_text())
    qcfg = config["quantization_config"]  # the default format
    assert qcfg["quant_method"] == "compressed-tensors"
    assert qcfg["config_groups"]["group_0"]["weights"]["group_size"] == 64
    log = json.loads((out / "quant_log.json").read_text())
    assert log["method"] == "awq" and log["config"]["clip_search"] is True
    assert (out / "artifacts" / ARTIFACT_NAME).is_file()  # the search travels with the checkpoint
    assert not Path(str(out) + ".work").exists()  # resume state is removed after success
    loaded, _, _ = load_model(out)
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == 14
    ids = _calib(1, 16, seed=3)
    logits = loaded(ids).logits
    assert torch.isfinite(logits).all()
    # The checkpoint computes what the replayed artifact computes.
    replayed, _, _ = load_model(tiny_model_dir)
    apply_awq_artifact(replayed, out / "artifacts" / ARTIFACT_NAME)
    assert torch.allclose(replayed(ids).logits, logits, atol=1e-4)
    # ... and so does the checkpoint `qcal quantize --awq-artifact` writes, with no calib data.
    again = tmp_path / "replayed"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "awq",
                 "--awq-artifact", str(out / "artifacts" / ARTIFACT_NAME),
                 "-o", str(again)]) == 0
    assert json.loads((again / "quant_log.json").read_text())["calibration"] is None
    reloaded, _, _ = load_model(again)
    assert torch.allclose(reloaded(ids).logits, logits, atol=1e-5)
    # The replay writes the --format asked for, and says how it was made.
    as_awq = tmp_path / "replayed-awq"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "awq",
                 "--awq-artifact", str(out / "artifacts" / ARTIFACT_NAME), "--format", "awq",
                 "-o", str(as_awq)]) == 0
    assert json.loads((as_awq / "config.json").read_text())["quantization_config"][
        "quant_method"] == "awq"
    replay_log = json.loads((as_awq / "quant_log.json").read_text())
    assert replay_log["format"] == "awq" and "--awq-artifact" in replay_log["command"]
    reloaded, _, _ = load_model(as_awq)
    assert torch.allclose(reloaded(ids).logits, logits, atol=1e-5)


def test_cli_awq_artifact_errors(tiny_model_dir: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    from qcal.cli import main

    missing = tmp_path / "nope.safetensors"
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "awq",
                 "--awq-artifact", str(missing), "-o", str(tmp_path / "o")]) == 2
    assert "nope.safetensors does not exist" in capsys.readouterr().err
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a safetensors file")
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "gptq",
                 "--awq-artifact", str(bogus), "-o", str(tmp_path / "o")]) == 2
    assert "use it with --method awq" in capsys.readouterr().err
    assert main(["quantize", "--model", str(tiny_model_dir), "--method", "awq",
                 "--awq-artifact", str(bogus), "-o", str(tmp_path / "o")]) == 2
    assert "is not a readable qcal AWQ search artifact" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("selector", ["random", "zipf", "perplexity", "ml:en", "mix:en=0.5,de=0.5"])
def test_every_selector_output_feeds_awq(selector: str, tiny_model_dir: Path) -> None:
    from qcal.calib import SELECTORS, build_calib
    from qcal.data.corpus import Document
    from qcal.model.tiny import stdlib_text

    covered = {"random", "zipf", "perplexity", "multilingual"}
    assert set(SELECTORS.names()) <= covered, "a new selector is registered: add it to this test"
    model, tok, _ = load_model(tiny_model_dir)
    de = ("Der Paketmanager lädt die Dateien aus dem Depot herunter und installiert sie auf dem "
          "System, wenn der Benutzer es wünscht und die Abhängigkeiten erfüllt sind. ") * 4
    docs = [Document(t, "en", "stdlib", f"en{i}", "user") for i, t in enumerate(stdlib_text()[:60])]
    docs += [Document(de, "de", "test", f"de{i}", "user") for i in range(8)]
    options = {"model": model} if selector == "perplexity" else {}
    calib = build_calib(docs, tok, n=4, seqlen=32, seed=0, selector=selector, **options)
    losses, artifact = awq_quantize_model(model, FAST, calib.input_ids, RunOptions(progress=False))
    assert len(artifact["layers"]) == 2 and all(v is not None and v >= 0 for v in losses.values())
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 14


@torch.no_grad()
def test_group_losses_linear_exact_and_subsampled(mha_model_dir: Path) -> None:
    """The lone-linear loss (Gram) equals running the linear; a token budget makes the MLP
    and attention losses score a subset, and the search still never loses to RTN."""
    from qcal.methods.awq_inputs import InputDigest, search_batches
    from qcal.methods.awq_search import _block_loss, _group_loss, _input_plans
    from qcal.model.capture import feed_linear_inputs
    from qcal.model.distributed import SINGLE
    from qcal.quant import awq

    model, _, _ = load_model(mha_model_dir)
    spec = arch_for(model)
    layer = decoder_layers(model, spec)[0]
    inputs = capture_layer0_inputs(model, spec, _calib(6, 32), batch_size=2)
    feats: dict[str, list[torch.Tensor]] = {}
    feed_linear_inputs(layer, inputs, ["mlp.down_proj", "self_attn.q_proj", "mlp.gate_proj"],
                       lambda n, x: feats.setdefault(n, []).append(x))
    down = spec.scale_groups[3]
    assert down.linears == (down.block,)
    lin = layer.get_submodule("mlp.down_proj")
    fake = {"mlp.down_proj": awq.fake_quant(lin.weight.detach(), QuantScheme(3, 32))}
    exact = _block_loss(lin, {"mlp.down_proj": lin}, feats["mlp.down_proj"],
                        [{}] * len(feats["mlp.down_proj"]), SINGLE)(fake)

    def digests(cfg: AWQConfig) -> dict[str, InputDigest]:
        plans = _input_plans(layer, spec, list(spec.scale_groups), inputs, cfg, SINGLE)
        return {rep: InputDigest.of(feats[rep], plans[rep]) for rep in feats}

    small = digests(AWQConfig(search_tokens=64))
    assert small["mlp.down_proj"].gram is not None and not small["mlp.down_proj"].batches
    gram = _group_loss(layer, down, small["mlp.down_proj"], inputs.kwargs, SINGLE)(fake)
    assert math.isclose(gram, exact, rel_tol=1e-4)
    # Attention keeps only the chosen whole batches, the MLP a token sample: no full copies.
    assert sorted(small["self_attn.q_proj"].batches) == [0]
    assert small["mlp.gate_proj"].search is not None and not small["mlp.gate_proj"].batches
    assert sorted(digests(AWQConfig(search_tokens=0))["self_attn.q_proj"].batches) == [0, 1, 2]
    assert search_batches(3, 64, 64) == [0]  # batches of 2 x 32 tokens
    assert search_batches(3, 64, 65) == [0, 2]
    assert search_batches(3, 64, 0) == [0, 1, 2]
    sample = small["mlp.gate_proj"].search.sample()
    assert torch.equal(sample, awq.subsample_tokens(feats["mlp.gate_proj"], 64))
    for group, rep in ((spec.scale_groups[0], "self_attn.q_proj"),
                       (spec.scale_groups[2], "mlp.gate_proj")):
        linears = {n: layer.get_submodule(n) for n in group.linears}
        weights = {n: m.weight.detach().clone() for n, m in linears.items()}
        found = awq.search_scale(awq.channel_abs_mean(feats[rep]), weights, _group_loss(
            layer, group, small[rep], inputs.kwargs, SINGLE), QuantScheme(4, 32), 5)
        assert found.loss <= found.rtn_loss and math.isfinite(found.loss)
