"""GPTQ's attention replay: same layer outputs as running the block, safe when it is not."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from qcal.config import GPTQConfig, QuantScheme
from qcal.methods.gptq_runner import quantize_layer_gptq
from qcal.model.arch import decoder_layers
from qcal.model.capture import LayerInputs, capture_layer0_inputs, run_layer
from qcal.model.loading import load_model
from qcal.model.replay import AttentionReplay, release_replay
from qcal.model.resolve import arch_for

pytestmark = pytest.mark.integration

CFG = GPTQConfig(QuantScheme(4, 32))


@pytest.fixture(scope="module")
def layer_and_inputs(tiny_model_dir: Path) -> tuple[torch.nn.Module, LayerInputs, tuple]:
    net, _, _ = load_model(tiny_model_dir)
    spec = arch_for(net)
    calib = torch.randint(3, 200, (6, 40), generator=torch.Generator().manual_seed(0))
    # batch_size 2: three batches, so replay must hand each batch its own recording.
    inputs = capture_layer0_inputs(net, spec, calib, batch_size=2)
    return decoder_layers(net, spec)[0], inputs, spec


def _quantized_outputs(layer: torch.nn.Module, inputs: LayerInputs, spec, attention
                       ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], int]:
    """Weights and outputs after quantizing a copy of `layer`, and how often its attention
    core and its norm ran (q_proj is called only then, whichever module holds that name by
    now; a skipped norm returns a zero-stride tensor)."""
    layer = copy.deepcopy(layer)
    calls = {"core": 0, "norm": 0}

    def count(module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        calls["core"] += module is layer.self_attn.q_proj
        calls["norm"] += module is layer.input_layernorm and any(out.stride())

    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        quantize_layer_gptq(layer, inputs, spec.sequential, CFG, attention=attention,
                            attention_norm=spec.attention_norm, packed=False)
        outs = run_layer(layer, inputs, "cpu", torch.float32)
    finally:
        handle.remove()
    replay_left = "_qcal_attention_replay" in layer.__dict__
    release_replay(layer)
    assert "_qcal_attention_replay" not in layer.__dict__
    assert "forward" not in layer.self_attn.__dict__  # the block runs itself again
    assert "forward" not in layer.input_layernorm.__dict__  # and so does its norm
    assert replay_left == (attention is not None)
    return {k: v.clone() for k, v in layer.state_dict().items()}, outs, calls


def test_replay_gives_the_same_weights_and_outputs_as_running_attention(layer_and_inputs) -> None:
    layer, inputs, spec = layer_and_inputs
    with_replay, out_replay, replayed_calls = _quantized_outputs(layer, inputs, spec,
                                                                 spec.attention)
    plain, out_plain, plain_calls = _quantized_outputs(layer, inputs, spec, None)
    # The core and its norm really were skipped in later passes.
    assert replayed_calls["core"] < plain_calls["core"]
    assert replayed_calls["norm"] < plain_calls["norm"]
    assert with_replay.keys() == plain.keys()
    for key in plain:
        assert torch.equal(with_replay[key], plain[key]), key
    for a, b in zip(out_replay, out_plain, strict=True):
        assert torch.equal(a, b)


def test_replay_that_would_differ_warns_and_runs_the_block(layer_and_inputs) -> None:
    layer, inputs, _ = layer_and_inputs
    layer = copy.deepcopy(layer)
    replay = AttentionReplay(layer, "self_attn", "self_attn.o_proj", len(inputs.hidden))
    replay.record()
    run_layer(layer, inputs, "cpu", torch.float32, inplace=False)
    replay.replay()
    # q_proj changes after the recording: the stored o_proj inputs are stale now.
    with torch.no_grad():
        layer.self_attn.q_proj.weight.mul_(1.5)
    with pytest.warns(UserWarning, match="differs from running it"):
        got = run_layer(layer, inputs, "cpu", torch.float32, inplace=False)
    release_replay(layer)
    expected = run_layer(layer, inputs, "cpu", torch.float32, inplace=False)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_no_replay_when_a_step_order_would_make_it_stale(layer_and_inputs) -> None:
    from qcal.methods.gptq_runner import _attention_replay

    layer, inputs, spec = layer_and_inputs
    one_step = (tuple(spec.linear_names),)  # q/k/v and o_proj in the same step
    assert _attention_replay(layer, one_step, spec.attention, len(inputs.hidden)) is None
    assert _attention_replay(layer, spec.sequential, None, len(inputs.hidden)) is None


def test_cached_output_changed_in_place_is_not_reused(layer_and_inputs) -> None:
    layer, inputs, _ = layer_and_inputs
    layer = copy.deepcopy(layer)
    # With the norm skipped once the check passed, the real block must get its real input.
    replay = AttentionReplay(layer, "self_attn", "self_attn.o_proj", len(inputs.hidden),
                             "input_layernorm")
    replay.record()
    run_layer(layer, inputs, "cpu", torch.float32, inplace=False)
    replay.replay()
    first = run_layer(layer, inputs, "cpu", torch.float32, inplace=False)  # checked, cached
    with torch.no_grad():
        replay.cache[1].add_(1.0)  # as a pass that modified the block's output in place would
    with pytest.warns(UserWarning, match="differs from running it"):
        again = run_layer(layer, inputs, "cpu", torch.float32, inplace=False)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    release_replay(layer)
