"""A small, dependency-free language identifier for prose paragraphs.

Two stages:

1. Unicode script. Letters are counted per script; CJK ideographs, kana and Hangul
   count three times (one such character carries about as much text as three Latin
   letters), so a Chinese sentence with an embedded ``apt-get`` command is still Chinese.
   Non-Latin scripts map to a language directly (Cyrillic -> ru/uk, Arabic -> ar/fa,
   Han + kana -> ja, Han -> zh or zh-tw, ...).
2. Latin script: stop-word profiles. Every token found in a language's list of function
   words scores ``1 / (number of languages whose list holds it)``, so shared words such
   as "de" or "a" count little and distinctive ones ("the", "und", "och") decide.

It is built for what qcal needs: telling translated paragraphs from untranslated
English ones, and tagging user text. It is not a general classifier: returns ``None``
when there is too little evidence rather than guessing.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

# Function words per Latin-script language. Kept short and frequent on purpose: a
# paragraph of 20 words almost always contains several of them.
_STOPWORDS: dict[str, str] = {
    "en": "the of and to in is that it for as with was on are be this by not or from at "
    "which but have an they you can has their we will if its all been were also there "
    "when would other these what who so only into than such may some then them should "
    "each does do because however while your how any about more most through between "
    "after before over where here both those our it's these must could",
    "de": "der die und das ist nicht ein eine zu den von mit sich des auf für im dem auch "
    "es wird werden sind als oder bei nach wie aus kann einer einen können wenn nur noch "
    "diese durch über sie wir ich zum zur dass daß man hat haben sein dieser muss damit",
    "fr": "le la les de des et est un une du en dans que qui pour pas sur par au aux ne se "
    "ce cette il elle sont avec plus ou peut être son sa ses leur nous vous on mais comme "
    "été fait tout très aussi lors si donc",
    "es": "el la los las de del y en que es un una por para con no se al lo su sus como "
    "más pero este esta son está también puede ser hay entre sin sobre cuando muy ya "
    "desde usted",
    "it": "il lo la gli le di del della dei delle e è che un una per con non si da in al "
    "alla sono come più anche questo questa essere può ma nel nella degli sul ha hanno "
    "viene quindi",
    "pt": "o a os as de do da dos das e é que um uma em no na nos nas para por com não se "
    "ao à como mais mas este esta são também pode ser seu sua pelo pela ou isso você",
    "nl": "de het een en van is dat in op te voor met niet zijn die aan er als ook door bij "
    "dan maar om worden wordt kan deze dit naar nog of uit zo wel heeft hebben geen",
    "ca": "el la els les de del i en que és un una per amb no es al als com més però "
    "aquest aquesta són també pot ser hi ho seu seva dels pel això cal on perquè molt",
    "id": "yang dan di ini itu dengan untuk dari dalam tidak akan pada adalah ke atau juga "
    "oleh dapat ada bisa sebagai karena lebih telah sudah jika saat kita mereka harus "
    "hanya seperti bahwa kepada kami tersebut lain namun masih setiap semua sangat "
    "secara melalui memiliki",
    "sv": "och att det som en är på för av med till den inte har de om ett kan eller man "
    "så från vid när sig också denna detta dessa måste ska finns efter under alla",
    # Bokmål and Danish share most function words; the lists stress where they differ
    # (av/af, seg/sig, etter/efter, blir/bliver, noen/nogen, mye/meget, å/at, ...).
    "nb": "og i det som en er på for av med til den ikke har de om et kan eller man så fra "
    "ved når seg også denne dette disse må skal finnes etter under alle hvis bare være "
    "kun å gjennom mellom noen noe mye slik deg meg blir hva mer hvordan bli",
    "da": "og i det som en er på for af med til den ikke har de om et kan eller man så fra "
    "ved når sig også denne dette disse skal efter under alle hvis kun bliver være "
    "gennem mellem nogen noget meget sådan dig mig hvad mere hvordan blive",
    "pl": "i w na z że się nie do to jest jak o co a po ale od przez dla lub tak jego są "
    "być może by który która które tylko już jednak także oraz przy czy",
    "cs": "a v na se je že s z do to o jako pro není by jsou k ale nebo jeho které který "
    "která také tak jen podle při může být už tento této",
    "hr": "i u na je se da za s od do o ne su kao ili što koji koja koje to biti može samo "
    "sa ako će ali već još iz nije bi",
    "ro": "și în de la a cu pe că este nu o un una din ce care se mai sau pentru sunt al ale "
    "lui fi poate dacă prin acest această dar",
    "tr": "ve bir bu da de için ile olarak olan gibi daha çok en ne var ya her ama kadar "
    "sonra değil ise veya şu tüm bunu bunun",
    "vi": "và của là có không được các những cho một trong với này để người đã khi từ như "
    "thì về đến hoặc cũng nhưng sẽ",
}

# Characters unique to one writing variant of Chinese (simplified vs traditional),
# aligned pair by pair. Common words in technical prose, so a paragraph of either
# variant nearly always contains some.
_SIMPLIFIED = (
    "这个们说来时为会国对发后实进过还经动关开问应现软统网络务机数据设装库录档页户认证书读"
    "写错误选项题边与从产样让将无么单变换级运护维调试执许权类显连线电脑码编译语简体条协议"
    "转视图层区础节给该种头长门间义员张场达带标际组织结构历处业东车资传买卖虚拟储备复杂态"
    "阶验险启断块获环属赖"
)
_TRADITIONAL = (
    "這個們說來時為會國對發後實進過還經動關開問應現軟統網絡務機數據設裝庫錄檔頁戶認證書讀"
    "寫錯誤選項題邊與從產樣讓將無麼單變換級運護維調試執許權類顯連線電腦碼編譯語簡體條協議"
    "轉視圖層區礎節給該種頭長門間義員張場達帶標際組織結構歷處業東車資傳買賣虛擬儲備複雜態"
    "階驗險啟斷塊獲環屬賴"
)
assert len(_SIMPLIFIED) == len(_TRADITIONAL)
_SIMP_ONLY = frozenset(_SIMPLIFIED) - frozenset(_TRADITIONAL)
_TRAD_ONLY = frozenset(_TRADITIONAL) - frozenset(_SIMPLIFIED)

# Letters that single out one language within its script.
_PERSIAN_LETTERS = frozenset("پچژگکی")  # absent from standard Arabic orthography
_ARABIC_LETTERS = frozenset("يكةى")  # Arabic forms Persian writes differently
_UKRAINIAN_LETTERS = frozenset("іїєґ")

# Aliases accepted by ``is_language`` (region tags, legacy codes).
_ALIASES = {
    "zh-cn": "zh",
    "zh-hans": "zh",
    "zh-sg": "zh",
    "zh-tw": "zh-tw",
    "zh-hant": "zh-tw",
    "zh-hk": "zh-tw",
    "no": "nb",
    "nn": "nb",
    "pt-br": "pt",
    "pt-pt": "pt",
}

_WORD = re.compile(r"[^\W\d_]+")
_MIN_LETTERS = 12  # fewer letters than this: not enough evidence for any language
_MIN_LATIN_HITS = 2  # stop-word tokens needed before a Latin-script guess is made
_MIN_LATIN_SCORE = 0.04  # mean weighted stop-word score per token


@lru_cache(maxsize=1)
def _weights() -> dict[str, dict[str, float]]:
    """Per language: stop word -> weight, 1 / (number of languages listing it)."""
    lists = {lang: frozenset(words.split()) for lang, words in _STOPWORDS.items()}
    df = Counter(w for words in lists.values() for w in words)
    # One-letter words count half: Roman numerals, variables and list markers look like
    # them ("System V", "option s").
    return {
        lang: {w: (0.5 if len(w) == 1 else 1.0) / df[w] for w in words}
        for lang, words in lists.items()
    }


def _script(ch: str) -> str | None:
    """Coarse Unicode script of a letter (by code point block)."""
    o = ord(ch)
    if o < 0x250 or 0x1E00 <= o <= 0x1EFF:
        return "latin"
    if 0x370 <= o <= 0x3FF or 0x1F00 <= o <= 0x1FFF:
        return "greek"
    if 0x400 <= o <= 0x52F:
        return "cyrillic"
    if 0x590 <= o <= 0x5FF:
        return "hebrew"
    if 0x600 <= o <= 0x6FF or 0x750 <= o <= 0x77F or 0xFB50 <= o <= 0xFEFF:
        return "arabic"
    if 0x900 <= o <= 0x97F:
        return "devanagari"
    if 0xE00 <= o <= 0xE7F:
        return "thai"
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
        return "kana"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
        return "hangul"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF:
        return "han"
    return None


_DENSE = {"han": 3, "kana": 3, "hangul": 3}  # weight of one character vs a Latin letter
_SCRIPT_LANG = {"greek": "el", "hebrew": "he", "devanagari": "hi", "thai": "th", "hangul": "ko"}


def script_profile(text: str) -> Counter[str]:
    """Weighted letter counts per script (see module docstring)."""
    counts: Counter[str] = Counter()
    for ch in text:
        # Kana marks and the prolonged sound mark are not "alpha" in every case.
        if ch.isalpha() or unicodedata.category(ch) == "Lm":
            script = _script(ch)
            if script is not None:
                counts[script] += _DENSE.get(script, 1)
    return counts


def han_variant_counts(text: str) -> tuple[int, int]:
    """(simplified-only, traditional-only) character counts in ``text``."""
    simp = sum(ch in _SIMP_ONLY for ch in text)
    trad = sum(ch in _TRAD_ONLY for ch in text)
    return simp, trad


def latin_scores(text: str) -> dict[str, float]:
    """Mean weighted stop-word score per token for each Latin-script language."""
    tokens = _WORD.findall(text.lower())
    if not tokens:
        return {}
    weights = _weights()
    counts = Counter(tokens)
    return {
        lang: sum(w.get(tok, 0.0) * n for tok, n in counts.items()) / len(tokens)
        for lang, w in weights.items()
    }


def _detect_latin(text: str) -> str | None:
    tokens = _WORD.findall(text.lower())
    weights = _weights()
    known = set().union(*weights.values())
    if sum(tok in known for tok in tokens) < _MIN_LATIN_HITS:
        return None
    scores = latin_scores(text)
    best = max(scores, key=scores.__getitem__)
    return best if scores[best] >= _MIN_LATIN_SCORE else None


def detect_language(text: str) -> str | None:
    """Best-guess language code of ``text`` (ISO 639-1, plus ``zh-tw``), or ``None``.

    ``None`` means too little evidence (very short text, code, numbers) or a
    Latin-script language without a stop-word profile here.
    """
    profile = script_profile(text)
    total = sum(profile.values())
    if total < _MIN_LETTERS:
        return None
    # Han and kana together form Japanese; look at them as one block first.
    cjk = profile["han"] + profile["kana"]
    ranked = Counter({k: v for k, v in profile.items() if k not in ("han", "kana")})
    if cjk:
        ranked["cjk"] = cjk
    script, _ = ranked.most_common(1)[0]
    if script == "latin":
        return _detect_latin(text)
    if script == "cjk":
        # Japanese prose is typically 30-60% kana; Chinese has none.
        if profile["kana"] >= 0.05 * cjk:
            return "ja"
        simp, trad = han_variant_counts(text)
        return "zh-tw" if trad > simp else "zh"
    if script == "cyrillic":
        return "uk" if any(ch in _UKRAINIAN_LETTERS for ch in text.lower()) else "ru"
    if script == "arabic":
        persian = sum(ch in _PERSIAN_LETTERS for ch in text)
        arabic = sum(ch in _ARABIC_LETTERS for ch in text)
        return "fa" if persian > arabic else "ar"
    return _SCRIPT_LANG.get(script)


def normalize_lang(lang: str) -> str:
    """Lower-case a language tag and fold region variants qcal does not distinguish."""
    tag = lang.strip().lower().replace("_", "-")
    if tag in _ALIASES:
        return _ALIASES[tag]
    return tag.split("-")[0]


def is_language(text: str, lang: str) -> bool:
    """True if ``text`` is written in ``lang`` (tags such as ``pt-BR`` are accepted).

    Chinese without any variant-specific character counts as either variant, since
    nothing in it says otherwise.
    """
    target = normalize_lang(lang)
    found = detect_language(text)
    if found is None:
        return False
    if target in ("zh", "zh-tw") and found in ("zh", "zh-tw"):
        simp, trad = han_variant_counts(text)
        return (trad >= simp) if target == "zh-tw" else (simp >= trad)
    return found == target


def supported_languages() -> list[str]:
    """Codes ``detect_language`` can return."""
    non_latin = ["ar", "el", "fa", "he", "hi", "ja", "ko", "ru", "th", "uk", "zh", "zh-tw"]
    return sorted([*_STOPWORDS, *non_latin])
