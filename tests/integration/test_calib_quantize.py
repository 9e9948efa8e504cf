"""Every selector's set feeds the quantizers unchanged; the calib CLI builds, shows and lists sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcal.calib import CalibSet, build_calib, resolve_calib
from qcal.cli import main
from qcal.config import GPTQConfig, QuantScheme, RTNConfig
from qcal.data.corpus import Document, write_jsonl
from qcal.methods import METHODS
from qcal.model.loading import load_tokenizer
from qcal.model.tiny import stdlib_text
from qcal.run import quantize_model_dir

pytestmark = pytest.mark.integration

DE = ("Der Paketmanager lädt die Dateien aus dem Depot herunter und installiert sie auf dem "
      "System, wenn der Benutzer es wünscht und alle Abhängigkeiten erfüllt sind.")
SELECTORS = ["random", "zipf", "ml:de", "mix:en=0.5,de=0.5", "perplexity"]
N, SEQLEN = 8, 32


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    en = [Document(t, "en", "stdlib", f"en{i}", "user") for i, t in enumerate(stdlib_text()[:120])]
    de = [Document(f"{DE} Abschnitt {i}.", "de", "local", f"de{i}", "user") for i in range(80)]
    return en + de


@pytest.fixture(scope="module")
def saved_sets(tiny_model_dir: Path, corpus: list[Document],
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tok = load_tokenizer(tiny_model_dir)
    root = tmp_path_factory.mktemp("calib_sets")
    out = {}
    for spec in SELECTORS:
        # perplexity: no model passed, so the float model of the tokenizer's dir scores
        # (a seeded subset of the pool, to keep the test fast on 2 cores).
        extra = {"max_candidates": 96, "progress": False} if spec == "perplexity" else {}
        calib = build_calib(corpus, tok, N, SEQLEN, seed=0, selector=spec, source="test", **extra)
        out[spec] = calib.save(root / spec.replace(":", "-").replace(",", "_").replace("=", ""))
    return out


def _methods() -> list[str]:
    return [m for m in ("rtn", "gptq") if m in METHODS]


@pytest.mark.parametrize("method", _methods())
@pytest.mark.parametrize("spec", SELECTORS)
def test_every_selector_feeds_quantization(spec: str, method: str, saved_sets: dict[str, Path],
                                           tiny_model_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    calib = resolve_calib(str(saved_sets[spec]), tok, nsamples=N, seqlen=SEQLEN, seed=0)
    assert calib.input_ids.shape == (N, SEQLEN) and calib.input_ids.dtype == torch.long
    assert int(calib.input_ids.max()) < len(tok)
    scheme = QuantScheme(4, 64)
    cfg = RTNConfig(scheme) if method == "rtn" else GPTQConfig(scheme)
    out = tmp_path / "ckpt"
    log = quantize_model_dir(tiny_model_dir, method, cfg, out, calib.input_ids, calib.manifest)
    assert (out / "model.safetensors").is_file()
    saved = json.loads((out / "quant_log.json").read_text())
    assert saved["calibration"]["digest"] == calib.digest
    assert all(v is None or v >= 0 for v in log["losses"].values())


def test_cli_build_show_list_and_quantize(tiny_model_dir: Path, corpus: list[Document],
                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "pool.jsonl"
    write_jsonl(src, corpus)
    sets = tmp_path / "sets"
    out = sets / "zipf-mini"
    rc = main(["calib", "build", "--selector", "zipf", "--source", str(src), "--model",
               str(tiny_model_dir), "--n", str(N), "--seqlen", str(SEQLEN), "-o", str(out)])
    assert rc == 0
    built = json.loads(capsys.readouterr().out)
    assert built["nsamples"] == N and CalibSet.load(out).digest == built["digest"]

    rc = main(["calib", "build", "--selector", "multilingual", "--langs", "en,de", "--weights",
               "3,1", "--source", str(src), "--model", str(tiny_model_dir), "--n", str(N),
               "--seqlen", str(SEQLEN), "-o", str(sets / "ml")])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["per_language_tokens"] == {"de": 2 * SEQLEN,
                                                                          "en": 6 * SEQLEN}

    assert main(["calib", "show", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["selector"] == "zipf" and shown["params"]["objective"] == "coverage"
    assert main(["calib", "list", "--dir", str(sets)]) == 0
    listing = capsys.readouterr().out
    assert "zipf-mini: zipf" in listing and "ml: multilingual" in listing

    # Too little text: a clear error, exit code 2, no traceback, nothing written.
    rc = main(["calib", "build", "--source", str(src), "--model", str(tiny_model_dir), "--n",
               "100000", "--seqlen", str(SEQLEN), "-o", str(sets / "huge")])
    assert rc == 2 and "never padded" in capsys.readouterr().err
    assert not (sets / "huge").exists()

    if "gptq" in METHODS:
        ckpt = tmp_path / "gptq"
        rc = main(["quantize", "--model", str(tiny_model_dir), "--method", "gptq", "--group-size",
                   "64", "--calib", str(out), "--nsamples", str(N), "--seqlen", str(SEQLEN),
                   "-o", str(ckpt)])
        assert rc == 0
        log = json.loads((ckpt / "quant_log.json").read_text())
        assert log["calibration"]["digest"] == built["digest"]
