"""CLI subcommands: each module exposes `add_parser(subparsers)`; handlers call the library."""

from __future__ import annotations

from typing import Any


def add_text_options(parser: Any) -> None:
    """--text-field and --chat: how records of a user's file or dataset become text (the
    same two options wherever calibration text is read)."""
    parser.add_argument("--text-field", default="text",
                        help="the record field that holds the text (JSONL, Parquet, datasets)")
    parser.add_argument("--chat", action="store_true",
                        help="records are chats: render their 'messages' with the model's chat "
                             "template")
