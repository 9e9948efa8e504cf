"""`qcal calib build|show|list`: build, inspect and list saved calibration sets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from qcal.commands import add_text_options


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calib", help="build, show and list calibration sets")
    csub = p.add_subparsers(dest="calib_command", required=True)

    b = csub.add_parser("build", help="select a calibration set and save it with its manifest")
    b.add_argument("--selector", default="random",
                   help="random, zipf[:invfreq], perplexity[:low|high|middle], multilingual, "
                        "ml:<lang>, mix:uniform, mix:en=0.5,de=0.5, mix:<named mix>, or "
                        "self[:temperature=T,top_p=P,langs=en+de,prompts=FILE,batch=B] "
                        "(text the model writes itself)")
    b.add_argument("--source", default="debian-handbook",
                   help="packaged corpus name, .txt/.jsonl/.parquet file, dataset folder "
                        "(save_to_disk or data files), or hf:<dataset> (see qcal.data)")
    add_text_options(b)
    b.add_argument("--model", default=None, help="model dir whose tokenizer is used (default model)")
    b.add_argument("--n", type=int, default=128, help="number of windows")
    b.add_argument("--seqlen", type=int, default=512, help="tokens per window")
    b.add_argument("--seed", type=int, default=0, help="seed of the draw (>= 0)")
    b.add_argument("--langs", default=None, help="comma-separated languages to draw from (en,de,fr)")
    b.add_argument("--weights", default=None, help="multilingual: comma-separated weights per --langs")
    b.add_argument("--mix", default=None, help="multilingual: 'uniform' or a named mix (study10, ...)")
    b.add_argument("--inner", default=None, help="multilingual: selector inside each language")
    b.add_argument("--mode", default=None, help="perplexity: low, high or middle")
    b.add_argument("--objective", default=None, help="zipf: coverage (default) or invfreq")
    b.add_argument("--pool-size", type=int, default=None, help="zipf: random eligible pool per step")
    b.add_argument("--ref-model", default=None, help="perplexity: float reference model dir")
    b.add_argument("--device", default="auto",
                   help="perplexity: where the reference model scores (cpu, cuda, cuda:N, auto)")
    b.add_argument("--batch-size", type=int, default=None, help="perplexity: scoring batch size")
    b.add_argument("--score-tokens", type=int, default=None,
                   help="perplexity: score only the first K tokens of each window")
    b.add_argument("--max-candidates", type=int, default=None,
                   help="perplexity: score a seeded random subset of this many windows")
    b.add_argument("--no-pack", action="store_true",
                   help="reject documents shorter than seqlen instead of packing them")
    b.add_argument("--max-windows-per-doc", type=int, default=None,
                   help="at most this many windows from one document (default: no cap)")
    b.add_argument("-o", "--output", type=Path, default=None,
                   help="output dir (default calib_sets/<selector>-<source>[-<content digest>]"
                        "-n<N>-s<seqlen>-seed<S>)")
    b.add_argument("--overwrite", action="store_true",
                   help="replace an existing output that is not a qcal calibration set")
    b.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model directory's own Python code to run (off by default)")
    b.set_defaults(handler=run_build)

    s = csub.add_parser("show", help="print a saved set's manifest")
    s.add_argument("name", help="set directory or name under calib_sets/")
    s.add_argument("--full", action="store_true", help="include the per-sample list")
    s.set_defaults(handler=run_show)

    d = csub.add_parser("diagnose", help="is a calibration set good? text, leakage into "
                        "evaluation data, and the model's view of it against a target")
    d.add_argument("set", help="a saved set (directory or name) or anything --calib takes")
    d.add_argument("--model", default=None, help="model dir or Hub id (default model)")
    d.add_argument("--nsamples", type=int, default=128, help="windows when SET is a source")
    d.add_argument("--seqlen", type=int, default=512, help="tokens per window when SET is a source")
    d.add_argument("--seed", type=int, default=0, help="seed of the draw when SET is a source")
    d.add_argument("--target", default="en",
                   help="what the model will be used on: languages of the packaged corpus's "
                        "held-out chapters (en,de: one report each) or a saved set/source")
    d.add_argument("--target-windows", type=int, default=16, help="windows per target")
    d.add_argument("--layers", default="0,mid,last",
                   help="decoder layers the model statistics sample (indices, mid, last)")
    d.add_argument("--bits", type=int, default=4, help="scheme of the predicted damage")
    d.add_argument("--group-size", type=int, default=128, help="scheme of the predicted damage")
    d.add_argument("--no-model", action="store_true",
                   help="text and leakage only: load no model weights")
    d.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    d.add_argument("-o", "--output", type=Path, default=None,
                   help="report stem (writes STEM.json and STEM.md; default "
                        "results/diagnose-<set name>)")
    d.add_argument("--overwrite", action="store_true",
                   help="replace report files qcal did not write")
    d.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model directory's own Python code to run (off by default)")
    d.set_defaults(handler=run_diagnose)

    ls = csub.add_parser("list", help="list saved sets under calib_sets/")
    ls.add_argument("--dir", type=Path, default=None, help="folder to list (default calib_sets/)")
    ls.set_defaults(handler=run_list)


def _csv(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def selector_options(args: argparse.Namespace) -> tuple[str, dict[str, Any], list[str] | None]:
    """(selector string, options, languages to load) from the build arguments."""
    from qcal.errors import ConfigError

    selector = args.selector
    langs = _csv(args.langs)
    options: dict[str, Any] = {"mode": args.mode, "objective": args.objective,
                               "pool_size": args.pool_size, "ref_model": args.ref_model,
                               "batch_size": args.batch_size, "score_tokens": args.score_tokens,
                               "max_candidates": args.max_candidates, "inner": args.inner}
    if selector.startswith(("perplexity", "ppl")):
        from qcal.devices import resolve_device

        options["device"] = resolve_device(args.device)
    if args.weights or args.mix:
        if selector != "multilingual":
            raise ConfigError("--weights/--mix need --selector multilingual")
        if args.mix:
            selector = f"mix:{args.mix}"
        else:
            weights = [float(w) for w in _csv(args.weights) or []]
            if not langs or len(weights) != len(langs):
                raise ConfigError("--weights needs --langs with one weight per language")
            options["weights"] = tuple(weights)
    if selector == "multilingual" or selector.startswith("mix:"):
        options["langs"] = tuple(langs) if langs else None
    return selector, options, langs


def source_label(args: argparse.Namespace) -> str:
    """The source's part of a default set name: a local file or folder by its name and a
    digest of its content (and of --text-field/--chat), so two inputs never share a name."""
    from qcal.fsio import content_digest

    path = Path(args.source).expanduser()
    if args.source.startswith("hf:") and Path(args.source[3:]).expanduser().is_dir():
        path = Path(args.source[3:]).expanduser()
    elif not path.exists():
        return args.source.replace(":", "-").replace("/", "-")
    reading = "chat" if args.chat else args.text_field
    return f"{path.name.replace('.', '_')}-{content_digest(path, reading)[:10]}"


def run_build(args: argparse.Namespace) -> int:
    from qcal.calib import build_calib, calib_sets_dir, parse_selector
    from qcal.calib.build import source_languages
    from qcal.calib.io import CALIB_SET_KIND, is_legacy_calib_set
    from qcal.data import resolve_source
    from qcal.fsio import check_output, check_writable
    from qcal.model.loading import load_tokenizer, resolve_model_dir

    if args.selector.partition(":")[0] == "self":
        return _build_self(args)
    selector, options, langs = selector_options(args)
    sel = parse_selector(selector, **options)
    langs = source_languages(args.source, sel, langs)
    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    name = f"{selector.replace(':', '-').replace(',', '_').replace('=', '')}-{source_label(args)}"
    out = args.output or calib_sets_dir() / f"{name}-n{args.n}-s{args.seqlen}-seed{args.seed}"
    protected = (model_dir, Path(args.source) if Path(args.source).exists() else None)
    check_output(out, CALIB_SET_KIND, overwrite=args.overwrite, protected=protected,
                 legacy_owned=is_legacy_calib_set)
    check_writable(out, args.n * args.seqlen * 8)
    tokenizer = load_tokenizer(model_dir, args.trust_remote_code)
    from qcal.calib.chat import chat_renderer

    docs = resolve_source(args.source, split="calib", langs=langs, text_field=args.text_field,
                          render_chat=chat_renderer(tokenizer) if args.chat else None)
    calib = build_calib(docs, tokenizer, args.n, args.seqlen, args.seed, sel, source=args.source,
                        pack=not args.no_pack, max_windows_per_doc=args.max_windows_per_doc,
                        source_langs=langs)
    if args.chat or args.text_field != "text":
        calib.manifest["records"] = {"text_field": None if args.chat else args.text_field,
                                     "chat": args.chat}
    calib.save(out)
    st = calib.manifest["statistics"]
    print(json.dumps({"output": str(out), "selector": calib.manifest["selector"],
                      "params": calib.manifest["params"], "nsamples": calib.nsamples,
                      "seqlen": calib.seqlen, "types": st["types"],
                      "type_token_ratio": st["type_token_ratio"], "zipf": st["zipf"],
                      "per_language_tokens": st["per_language_tokens"],
                      "digest": calib.digest}, indent=2))
    return 0


def run_show(args: argparse.Namespace) -> int:
    from qcal.calib.io import MANIFEST_FILE, find_calib_set
    from qcal.calib.manifest import CalibSetError

    path = find_calib_set(args.name)
    if path is None:
        raise CalibSetError(f"no calibration set {args.name!r} (a directory or a name under "
                            "calib_sets/); see `qcal calib list`")
    manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    if not args.full:
        samples = manifest.pop("samples", [])
        manifest["samples"] = f"{len(samples)} samples (use --full to list their documents)"
    print(json.dumps({"path": str(path), **manifest}, indent=2, ensure_ascii=False))
    return 0


def run_list(args: argparse.Namespace) -> int:
    from qcal.calib import calib_sets_dir, list_calib_sets

    root = args.dir or calib_sets_dir()
    rows = list_calib_sets(root)
    if not rows:
        print(f"no calibration sets under {root}; build one with `qcal calib build`")
        return 0
    for r in rows:
        if "error" in r:
            print(f"{r['name']}: {r['error']}")
            continue
        langs = ",".join(r.get("languages") or {})
        print(f"{r['name']}: {r['selector']} {json.dumps(r['params'])} n={r['nsamples']} "
              f"seqlen={r['seqlen']} seed={r['seed']} source={r['source']} langs={langs} "
              f"types={r['types']} digest={r['digest']}")
    return 0


def _build_self(args: argparse.Namespace) -> int:
    """`qcal calib build --selector self[:...]`: windows the model writes (no --source)."""
    from qcal.calib import calib_sets_dir
    from qcal.calib.io import CALIB_SET_KIND, save_calib_set
    from qcal.calib.self_gen import self_calib_set
    from qcal.fsio import check_output, check_writable
    from qcal.model.loading import load_tokenizer, resolve_model_dir

    model_dir = resolve_model_dir(args.model, args.trust_remote_code)
    name = args.selector.replace(":", "-").replace(",", "_").replace("=", "").replace("/", "-")
    out = args.output or (calib_sets_dir()
                          / f"{name}-{model_dir.name}-n{args.n}-s{args.seqlen}-seed{args.seed}")
    check_output(out, CALIB_SET_KIND, overwrite=args.overwrite, protected=(model_dir,))
    check_writable(out, args.n * args.seqlen * 8)
    tokenizer = load_tokenizer(model_dir, args.trust_remote_code)
    calib = self_calib_set(tokenizer, args.n, args.seqlen, args.seed, args.selector)
    save_calib_set(calib, out)
    print(f"saved {calib.nsamples} self-generated windows to {out} "
          f"({calib.manifest['selection']['generation_seconds']} s)")
    return 0


def run_diagnose(args: argparse.Namespace) -> int:
    from qcal.calib.diagnose_job import diagnose_command

    return diagnose_command(args)
