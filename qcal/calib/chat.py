"""Chat records rendered through the model's chat template, bounded.

A chat template is Jinja code from the model folder. transformers runs it in Jinja's
sandbox, which stops attribute escapes and ranges over 100,000, but not a template that
loops for minutes per record or returns megabytes: each rendering here has a time and a
size bound, and every template failure (syntax, `raise_exception`, a sandbox refusal) is
one line naming the template's problem instead of an internal error. The template is
rendered once on a sample conversation when the renderer is made, so a broken template
is refused before any record is read.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from qcal.errors import ConfigError

RENDER_SECONDS = 5.0  # per record; real templates take milliseconds
RENDER_GROWTH = 16  # rendered characters per character of message content, at most
RENDER_SLACK = 64 << 10  # plus this many characters (system prompts, role markers)
SAMPLE = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]


class _Expired(Exception):
    pass


@contextlib.contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Raise _Expired in the block after `seconds` (main thread only: signals reach it; an
    alarm set by the caller is re-armed with what was left of it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(*_: object) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expired)
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            left = max(outer - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def render_bounded(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """`messages` through the tokenizer's chat template, or one ConfigError saying why not."""
    import jinja2

    name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    try:
        with _time_bound(RENDER_SECONDS):
            text = tokenizer.apply_chat_template(messages, tokenize=False)
    except _Expired:
        raise ConfigError(f"the chat template of {name} took over {RENDER_SECONDS:g} s on one "
                          "record; fix the template (tokenizer_config.json chat_template) or "
                          "drop --chat") from None
    except (jinja2.TemplateError, OverflowError, ValueError, TypeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(f"the chat template of {name} fails ({type(err).__name__}: {first}); "
                          "fix the template (tokenizer_config.json chat_template) or drop "
                          "--chat") from None
    if not isinstance(text, str):
        raise ConfigError(f"the chat template of {name} returned {type(text).__name__}, not "
                          "text; fix the template or drop --chat")
    content = sum(len(str(m.get("content", ""))) for m in messages)
    if len(text) > RENDER_GROWTH * content + RENDER_SLACK:
        raise ConfigError(f"the chat template of {name} made {len(text):,} characters of "
                          f"{content:,} characters of messages; fix the template or drop --chat")
    return text


def chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, Any]]], str]:
    """messages -> text with the tokenizer's chat template (what --chat uses), checked once
    on a sample conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("--chat renders records with the model's chat template, and this "
                          "tokenizer has none; drop --chat and name the text with --text-field")
    render_bounded(tokenizer, SAMPLE)
    return lambda messages: render_bounded(tokenizer, messages)
