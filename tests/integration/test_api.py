"""The Python API, each case in a fresh interpreter: `import qcal` is light, and
qcal.quantize / qcal.load / qcal.evaluate / qcal.calib.build go the CLI's route without
printing (messages go to the `qcal` logger)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qcal.model.tiny import stdlib_text

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".kpath"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "QCAL_RUNS_DIR": str(tmp_path / "runs")}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_import_qcal_is_light_and_exports_the_api(tmp_path: Path) -> None:
    run = _python("""
        import sys, qcal
        heavy = [m for m in ("torch", "transformers", "qcal.api") if m in sys.modules]
        print(heavy, callable(qcal.quantize), callable(qcal.load), callable(qcal.evaluate))
    """, tmp_path)
    assert run.stdout.strip() == "[] True True True"


def test_quantize_load_evaluate_from_a_path_without_printing(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:40]), encoding="utf-8")
    run = _python(f"""
        import json, logging, sys, torch, qcal
        records = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        logging.getLogger("qcal").addHandler(handler)
        logging.getLogger("qcal").setLevel(logging.INFO)
        model = qcal.quantize({str(tiny_model_dir)!r}, method="gptq", calib={str(text)!r},
                              scheme={{"bits": 4, "group_size": 32}}, nsamples=4, seqlen=32,
                              output="out", desc_act=True)
        again = qcal.load("out")
        ids = torch.tensor([[5, 17, 99, 240, 3, 77]])
        same = torch.equal(model(ids).logits, again(ids).logits)
        result = qcal.evaluate(model, ppl=True, langs=["en"], seqlen=32, max_windows=2,
                               device="cpu")
        ppl = result["perplexity"]["model"]["en"]["ppl"]
        sys.stderr.write(json.dumps({{"same": same, "ppl": ppl, "records": records}}) + "\\n")
    """, tmp_path)
    assert run.stdout == ""  # a library call prints nothing
    report = json.loads(run.stderr.strip().splitlines()[-1])
    assert report["same"] and report["ppl"] > 1
    assert [r.split(":")[0] for r in report["records"]] == ["gptq layer 0", "gptq layer 1"]
    log = json.loads((tmp_path / "out" / "quant_log.json").read_text())
    assert log["method"] == "gptq" and log["config"]["desc_act"] is True
    assert log["config"]["static_groups"] is True  # the default format's act-order form
    assert log["recipe"]["format"] == "compressed-tensors"


def test_in_memory_model_and_a_calib_set_built_in_python(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(stdlib_text()[:40]), encoding="utf-8")
    run = _python(f"""
        import qcal, qcal.calib
        from transformers import AutoModelForCausalLM, AutoTokenizer
        net = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})
        tok = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})
        net.name_or_path = "someorg/tiny-lm"  # as if it came from the Hub
        calib = qcal.calib.build({str(text)!r}, tokenizer=tok, nsamples=4, seqlen=32,
                                 output="myset")
        model = qcal.quantize(net, tokenizer=tok, method="gptq", calib=calib,
                              scheme={{"bits": 4, "group_size": 64, "sym": True}}, nsamples=4,
                              seqlen=32, output="out")
        import sys
        sys.stderr.write(type(model.model.layers[0].mlp.down_proj).__name__ + "\\n")
    """, tmp_path)
    assert run.stdout == "" and run.stderr.strip().splitlines()[-1] == "QuantLinear"
    assert (tmp_path / "myset" / "manifest.json").is_file()
    log = json.loads((tmp_path / "out" / "quant_log.json").read_text())
    assert log["config"]["scheme"]["sym"] is True and log["calibration"]["nsamples"] == 4
    assert 'base_model: "someorg/tiny-lm"' in (tmp_path / "out" / "README.md").read_text()


def test_a_lone_target_string_is_one_pattern(tiny_model_dir: Path, tmp_path: Path) -> None:
    """targets="q_proj" means the q_proj linears, not the characters of the string (issue 52:
    it matched every linear); a pattern that is not a string is refused in one line."""
    import qcal
    from qcal.errors import ConfigError
    from qcal.packing.checkpoint import quant_modules
    from qcal.packing.checkpoint_load import load_checkpoint

    out = tmp_path / "q-only"
    qcal.quantize(str(tiny_model_dir), method="rtn", scheme={"bits": 4, "group_size": 32},
                  output=out, targets="q_proj")
    names = list(quant_modules(load_checkpoint(out)))
    assert names and all(n.endswith("q_proj") for n in names), names
    with pytest.raises(ConfigError, match=r"qcal.quantize\(ignore=...\) 3 is invalid \(input "
                                          r"should be a valid string\)"):
        qcal.quantize(str(tiny_model_dir), method="rtn", output=tmp_path / "never",
                      ignore=[3])
    assert not (tmp_path / "never").exists()
