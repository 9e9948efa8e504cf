"""Turn the HTML of "The Debian Administrator's Handbook" into per-language documents.

Input: ``usr/share/doc/debian-handbook/html/<ll-CC>/*.html`` from Debian's
``debian-handbook`` package (one directory per translation, the same file names in
every language: a parallel corpus).

Pipeline per language:

1. Paragraphs: every ``<div class="para">``, parsed with lxml. Inline code (commands,
   file names, literals) stays in the text; block code (``<pre>``), URL blocks and
   index anchors are dropped.
2. Filters: a paragraph is dropped when it is mostly code (over half of its characters
   inside code elements, or under ``MIN_PROSE_LETTERS`` letters of prose), when it
   appears verbatim in the English edition (incomplete translations leave English
   paragraphs in place), or when its prose is not in the directory's language
   (``in_language``: catches untranslated paragraphs of an older English wording).
   The English edition itself gets only the code filter.
3. Split by chapter: a file belongs to the chapter its "up" links lead to; the chapters
   in ``HELD_OUT_CHAPTERS`` form the ``eval`` split, the rest ``calib``. The list is
   fixed and the same for every language, so no translation of an evaluation chapter
   ever lands in a calibration pool of another language either. Paragraph texts found
   in the eval split are removed from calib (boilerplate repeats across chapters), and
   repeated paragraphs are kept once.
4. Documents: consecutive kept paragraphs of one section (or one sidebar) are grouped,
   in book order, until a document holds at least ``min_doc_chars(lang)`` characters;
   a short remainder at the end of a section joins the section's previous document.
   Paragraphs inside a document are separated by a single newline.

Why this granularity: documents of whole sections would give only ~500 English
calibration documents, single paragraphs are too short (median ~275 characters). With
400 characters the English calib split has ~1,350 documents (median ~550 characters);
2,000 documents of >= 400 characters cannot exist, since the English calib prose is
only ~780k characters. ``wiki-summaries`` adds ~7,900 English documents.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree, html

from qcal.data.corpus import Document
from qcal.data.langid import detect_language, is_language, latin_scores

SOURCE = "debian-handbook"
HTML_SUBDIR = Path("usr/share/doc/debian-handbook/html")
ENGLISH_DIR = "en-US"

# Held-out chapters (file names of chapter pages; a chapter's sections go with it).
# Chosen once, from per-chapter volumes of the real package, so that the eval split
# holds ~17% of the English prose and 15-20% in most translations, including partial
# ones (which translated mostly the first chapters): 2 (case study), 5 (packaging
# system), 7 (solving problems), 14 (security). Never change it silently: eval numbers
# computed under another list are not comparable.
HELD_OUT_CHAPTERS: tuple[str, ...] = (
    "case-study.html",
    "packaging-system.html",
    "solving-problems.html",
    "security.html",
)
# Front matter (title page, legal notice, table of contents) is not prose.
SKIPPED_FILES = frozenset({"index.html"})

MIN_PROSE_LETTERS = 20  # letters outside code (CJK 3x); "For example:" is not prose
MAX_CODE_FRACTION = 0.5  # share of non-space characters inside code elements
MIN_ALPHA_FRACTION = 0.5  # share of letters among non-space characters
MIN_TAIL_CHARS = 100  # a lone section remainder shorter than this is dropped
# A translation is kept when it has at least this much text, in "units": characters,
# CJK characters counting 3 (see ``text_units``). Below that, a calibration pool or a
# perplexity measurement on it would say more about noise than about the language.
MIN_CALIB_UNITS = 100_000
MIN_EVAL_UNITS = 20_000

# Elements whose text is code, not prose (DocBook classes as rendered by publican).
_CODE_CLASSES = frozenset(
    {
        "command", "literal", "filename", "userinput", "computeroutput", "replaceable",
        "varname", "option", "email", "function", "parameter", "code", "prompt",
        "systemitem", "envar", "uri",
    }
)  # fmt: skip
_SKIP_CLASSES = frozenset({"url", "indexterm"})
_CONTAINER_CLASSES = frozenset(
    {"section", "sidebar", "chapter", "preface", "appendix", "highlights", "footnotes"}
)


def lang_code(dirname: str) -> str:
    """Handbook directory name -> short code: ``de-DE`` -> ``de``, ``zh-TW`` -> ``zh-tw``.

    Only Chinese keeps its region, because the two directories are written in two
    different scripts (simplified / traditional); Brazilian Portuguese is just ``pt``.
    """
    if dirname.lower() == "zh-tw":
        return "zh-tw"
    return dirname.split("-")[0].lower()


def min_doc_chars(lang: str) -> int:
    """Minimum document length: 400 characters, 160 for CJK (denser scripts)."""
    return 160 if lang in ("zh", "zh-tw", "ja", "ko") else 400


@dataclass(frozen=True)
class Paragraph:
    text: str  # whitespace-normalized, inline code included
    prose: str  # the same without inline code: what the language check looks at
    code_fraction: float
    file: str
    container: int  # index of the enclosing section/sidebar within the file


def _classes(el: etree._Element) -> set[str]:
    return set((el.get("class") or "").split())


def _collect(el: etree._Element, parts: list[tuple[str, bool]], in_code: bool) -> None:
    """Append (text, is_code) pieces of ``el`` in reading order, skipping non-prose."""
    if el.text:
        parts.append((el.text, in_code))
    for child in el:
        if isinstance(child.tag, str):  # comments and processing instructions have no tag
            cls = _classes(child)
            if child.tag != "pre" and not cls & _SKIP_CLASSES:
                code = in_code or child.tag == "code" or bool(cls & _CODE_CLASSES)
                _collect(child, parts, code)
        if child.tail:
            parts.append((child.tail, in_code))


def _weight(text: str) -> int:
    """Non-space characters, CJK counted 3x (as in langid): one ideograph or kana is
    worth about three Latin letters, so "addgroup 命令可以添加群组" is not "mostly code"."""
    return sum(3 if ord(ch) >= 0x2E80 else 1 for ch in text if not ch.isspace())


def text_units(text: str) -> int:
    """Amount of text comparable across scripts: characters, CJK counted 3x."""
    return sum(3 if ord(ch) >= 0x2E80 else 1 for ch in text)


def _container_of(para: etree._Element) -> etree._Element | None:
    for anc in para.iterancestors("div"):
        if _classes(anc) & _CONTAINER_CLASSES:
            return anc
    return None


def extract_paragraphs(path: Path) -> list[Paragraph]:
    """All ``div.para`` of one HTML file, in document order (no filtering)."""
    root = html.parse(str(path)).getroot()
    tree = root.getroottree()
    # Containers are keyed by their XPath: lxml element proxies are recreated on access,
    # so id() of an element is not a stable identity.
    containers: dict[str, int] = {}
    out: list[Paragraph] = []
    for div in root.iter("div"):
        if "para" not in _classes(div):
            continue
        parts: list[tuple[str, bool]] = []
        _collect(div, parts, in_code=False)
        text = " ".join("".join(t for t, _ in parts).split())
        prose = " ".join(" ".join(t for t, code in parts if not code).split())
        n_all = sum(_weight(t) for t, _ in parts)
        n_code = sum(_weight(t) for t, code in parts if code)
        box = _container_of(div)
        key = containers.setdefault(tree.getpath(box) if box is not None else "", len(containers))
        frac = n_code / n_all if n_all else 1.0
        out.append(Paragraph(text, prose, frac, path.name, key))
    return out


def _links(path: Path) -> dict[str, str]:
    """rel -> href of the ``<link>`` elements in the page head ("up", "next", ...)."""
    root = html.parse(str(path)).getroot()
    return {ln.get("rel"): ln.get("href", "") for ln in root.iter("link") if ln.get("rel")}


def book_structure(lang_dir: Path) -> tuple[list[str], dict[str, str]]:
    """(files in reading order, file -> chapter file) from the pages' navigation links."""
    links = {p.name: _links(p) for p in sorted(lang_dir.glob("*.html"))}
    order: list[str] = []
    page = "index.html"
    while page in links and page not in order:  # follow "next" from the title page
        order.append(page)
        page = links[page].get("next", "").split("#")[0]
    order += [name for name in sorted(links) if name not in order]

    def chapter(name: str, depth: int = 0) -> str:
        up = links.get(name, {}).get("up", "").split("#")[0]
        if not up or up == "index.html" or up not in links or depth > 10:
            return name
        return chapter(up, depth + 1)

    return order, {name: chapter(name) for name in links}


def in_language(prose: str, lang: str) -> bool:
    """Language check for one paragraph of a translation, lenient for close languages.

    Short list items ("programmer i en gang per uke;") can score a neighbour language
    (da for nb, es for ca) a little higher. What must go is untranslated English, so a
    paragraph also passes when it is not English, and its target language scores above
    English and at least 60% of the best score.
    """
    if is_language(prose, lang):
        return True
    found = detect_language(prose)
    if found in (None, "en"):
        return False
    scores = latin_scores(prose)
    if lang not in scores or not scores:
        return False
    return scores[lang] > scores["en"] and scores[lang] >= 0.6 * max(scores.values())


def is_prose(p: Paragraph) -> bool:
    """False for command lines, paths and other paragraphs that are mostly not prose."""
    if p.code_fraction > MAX_CODE_FRACTION:
        return False
    if _weight("".join(ch for ch in p.prose if ch.isalpha())) < MIN_PROSE_LETTERS:
        return False
    letters = _weight("".join(ch for ch in p.text if ch.isalpha()))
    return letters >= MIN_ALPHA_FRACTION * _weight(p.text)


@dataclass
class LanguageResult:
    lang: str
    dirname: str
    documents: list[Document] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> paragraphs
    kept_paragraphs: Counter[str] = field(default_factory=Counter)  # split -> paragraphs

    def split_stats(self, split: str) -> dict[str, int]:
        docs = [d for d in self.documents if d.split == split]
        return {
            "documents": len(docs),
            "paragraphs": self.kept_paragraphs[split],
            "chars": sum(len(d.text) for d in docs),
            "units": sum(text_units(d.text) for d in docs),
        }

    @property
    def kept(self) -> bool:
        """Enough real text in this language (thresholds above)."""
        return (
            self.split_stats("calib")["units"] >= MIN_CALIB_UNITS
            and self.split_stats("eval")["units"] >= MIN_EVAL_UNITS
        )


def _group(paras: list[Paragraph], min_chars: int) -> list[tuple[str, list[str]]]:
    """Group consecutive paragraphs of one (file, container): [(file, texts)]."""
    groups: list[tuple[tuple[str, int], list[str]]] = []
    current: list[str] = []
    size = 0
    for i, p in enumerate(paras):
        key = (p.file, p.container)
        current.append(p.text)
        size += len(p.text)
        nxt = paras[i + 1] if i + 1 < len(paras) else None
        section_ends = nxt is None or (nxt.file, nxt.container) != key
        if size >= min_chars or section_ends:
            if size < min_chars and groups and groups[-1][0] == key:
                groups[-1][1].extend(current)  # short remainder: extend the previous doc
            else:
                groups.append((key, current))
            current, size = [], 0
    return [(key[0], texts) for key, texts in groups if len("\n".join(texts)) >= MIN_TAIL_CHARS]


def build_language(
    lang_dir: Path,
    english: frozenset[str],
    order: list[str],
    chapters: dict[str, str],
) -> LanguageResult:
    """Documents of one translation. ``english``: paragraph texts of the English edition."""
    lang = lang_code(lang_dir.name)
    res = LanguageResult(lang=lang, dirname=lang_dir.name)
    files = [f for f in order if (lang_dir / f).exists() and f not in SKIPPED_FILES]
    kept: dict[str, list[Paragraph]] = {"calib": [], "eval": []}
    for name in files:
        split = "eval" if chapters.get(name, name) in HELD_OUT_CHAPTERS else "calib"
        for p in extract_paragraphs(lang_dir / name):
            if not is_prose(p):
                res.dropped["not_prose"] += 1
            elif lang != "en" and p.text in english:
                res.dropped["untranslated_verbatim"] += 1
            elif lang != "en" and not in_language(p.prose, lang):
                res.dropped["wrong_language"] += 1
            else:
                kept[split].append(p)
    # Eval text wins: a paragraph that also occurs in a held-out chapter leaves calib.
    eval_texts = {p.text for p in kept["eval"]}
    seen: set[str] = set()
    for split in ("eval", "calib"):
        unique = []
        for p in kept[split]:
            if p.text in seen or (split == "calib" and p.text in eval_texts):
                res.dropped["duplicate"] += 1
                continue
            seen.add(p.text)
            unique.append(p)
        res.kept_paragraphs[split] = len(unique)
        for n, (fname, texts) in enumerate(_group(unique, min_doc_chars(lang))):
            doc_id = f"{SOURCE}/{lang}/{split}/{Path(fname).stem}/{n:05d}"
            res.documents.append(Document("\n".join(texts), lang, SOURCE, doc_id, split))
    return res


def find_html_root(unpacked: Path) -> Path:
    """The ``html`` directory inside an unpacked package (or the path itself)."""
    for cand in (unpacked / HTML_SUBDIR, unpacked):
        if (cand / ENGLISH_DIR).is_dir():
            return cand
    raise FileNotFoundError(f"no {HTML_SUBDIR}/{ENGLISH_DIR} under {unpacked}")


def build_handbook(
    html_root: Path, progress: Callable[[str], None] | None = None
) -> dict[str, LanguageResult]:
    """Build every translation under ``html_root``; keys are short language codes."""
    en_dir = html_root / ENGLISH_DIR
    # Structure and held-out files come from the English edition, so that every
    # translation is split identically even if its own navigation links differ.
    order, chapters = book_structure(en_dir)
    english = frozenset(
        p.text for f in order if (en_dir / f).exists() for p in extract_paragraphs(en_dir / f)
    )
    missing = set(HELD_OUT_CHAPTERS) - set(chapters.values())
    if missing:
        raise ValueError(f"held-out chapters not found in {en_dir}: {sorted(missing)}")
    results: dict[str, LanguageResult] = {}
    dirs = sorted(d for d in html_root.iterdir() if d.is_dir() and "-" in d.name)
    for i, lang_dir in enumerate(dirs, 1):
        res = build_language(lang_dir, english, order, chapters)
        results[res.lang] = res
        if progress:
            c, e = res.split_stats("calib"), res.split_stats("eval")
            progress(
                f"[{i}/{len(dirs)}] {lang_dir.name:6s} -> {res.lang:5s} "
                f"calib {c['documents']:5d} docs {c['chars']:8d} chars | "
                f"eval {e['documents']:4d} docs {e['chars']:7d} chars"
                f"{'' if res.kept else '  (too thin: skipped)'}"
            )
    return results
