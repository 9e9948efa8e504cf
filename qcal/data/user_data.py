"""A user's own records as documents: `datasets` folders, Parquet files, chat records.

- a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (split `train`,
  or the only split);
- a local script-free dataset folder (data files `datasets` reads with its packaged
  builders: Parquet, JSON Lines, CSV, text); a folder holding a loading script is refused,
  as qcal never runs a dataset's code;
- a `.parquet` file.

A record's text is its `text_field` (default `text`), or with `chat` its `messages` (a list
of {"role", "content"}) rendered by `render_chat` (the model's chat template).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from qcal.errors import ConfigError, QcalError

from .corpus import Document, EmptyCorpusError

ChatRenderer = Callable[[list[dict[str, Any]]], str]


class CorpusFormatError(QcalError, ValueError):
    """A text file or record cannot be read as the format its name says (a record lacks
    the field, or the chat messages, it should be read by)."""


def record_text(rec: Mapping[str, Any], where: str, text_field: str = "text",
                render_chat: ChatRenderer | None = None) -> str:
    """The text of one record (stripped), by `text_field` or, with `render_chat`, its messages."""
    if render_chat is not None:
        messages = rec.get("messages")
        ok = isinstance(messages, list) and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages)
        if not ok:
            raise CorpusFormatError(f'{where}: --chat needs a "messages" list of '
                                    '{"role": ..., "content": ...} objects; fields: '
                                    f"{sorted(rec)}")
        try:
            return render_chat([dict(m) for m in messages]).strip()
        except ConfigError as err:
            raise CorpusFormatError(f"{where}: {err}") from None
    value = rec.get(text_field)
    if not isinstance(value, str):
        hint = " (or --chat for chat records)" if "messages" in rec else ""
        raise CorpusFormatError(f'{where}: no string field "{text_field}"; fields: {sorted(rec)}; '
                                f"pick one with --text-field{hint}")
    return value.strip()


def documents_from_records(records: Iterable[Mapping[str, Any]], source: str,
                           text_field: str = "text", render_chat: ChatRenderer | None = None,
                           tag: Callable[[str | None, str], str | None] | None = None) -> list[Document]:
    docs = []
    for i, rec in enumerate(records):
        text = record_text(rec, f"{source} record {i}", text_field, render_chat)
        if text:
            lang = rec.get("lang") if isinstance(rec.get("lang"), str) else None
            docs.append(Document(text, tag(lang, text) if tag else lang, source,
                                 f"{Path(source).name}:{i}", "user"))
    if not docs:
        raise EmptyCorpusError(f"no usable text in {source} (every record is empty)")
    return docs


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `save_to_disk` (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file())


def load_records(path: Path) -> Any:
    """The records of a dataset folder or a Parquet file, as a `datasets.Dataset`. Nothing
    is left in the datasets cache: a Parquet file is read in place, a folder of data files is
    prepared in a temporary cache that is removed again (a refused input leaves no copy)."""
    import datasets

    if path.is_file():
        if path.suffix.lower() != ".parquet":
            raise ConfigError(f"{path}: qcal reads .parquet, .txt and .jsonl files")
        return datasets.Dataset(_read_parquet(path))
    if is_saved_dataset(path):
        data = _load_saved(path)
    else:
        scripts = sorted(p.name for p in path.glob("*.py"))
        if scripts:
            raise ConfigError(f"{path} holds a dataset loading script ({scripts[0]}); qcal runs no "
                              "dataset code: save the data with Dataset.save_to_disk or as "
                              "Parquet/JSONL files")
        try:
            with tempfile.TemporaryDirectory(prefix="qcal-datasets-") as cache:
                data = datasets.load_dataset(str(path), cache_dir=cache, keep_in_memory=True)
        except Exception as err:  # noqa: BLE001  (datasets raises many kinds for a bad folder)
            raise ConfigError(f"{path} is not a dataset folder datasets can read "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); give "
                              "a save_to_disk folder or a folder of Parquet/JSONL/CSV/text "
                              "files") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" in data:
            return data["train"]
        if len(data) == 1:
            return next(iter(data.values()))
        raise ConfigError(f"{path} has splits {sorted(data)} and none is 'train'; save the one "
                          "to calibrate on as its own dataset")
    return data


def _read_parquet(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(str(path))
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"{path} is not a readable Parquet file ({str(err).splitlines()[0][:120]}"
                          "); give a Parquet, .txt or .jsonl file") from None


def _split_files(folder: Path) -> list[Path]:
    """The Arrow files a save_to_disk split folder's state.json names, each a plain file
    inside that folder (a name such as ../../x.arrow would read a file outside it)."""
    state = folder / "state.json"
    try:
        entries = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
        names = [entry["filename"] for entry in entries]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise ConfigError(f"{state} is not a save_to_disk state (JSON naming its _data_files); "
                          "save the dataset again with save_to_disk") from None
    files = []
    for name in names:
        if (not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..")
                or not (folder / name).is_file() or (folder / name).is_symlink()):
            raise ConfigError(f"{state} names {str(name)[:80]!r}, which is not a plain file in "
                              f"{folder}; save the dataset again with save_to_disk")
        files.append(folder / name)
    return files


def _load_saved(path: Path) -> Any:
    """A save_to_disk folder, its state checked first, any unreadable part named."""
    import datasets
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
            folders = [path / s for s in splits if isinstance(s, str) and Path(s).name == s]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            folders = []
        if not folders or any(not f.is_dir() for f in folders):
            raise ConfigError(f"{path / 'dataset_dict.json'} does not name the split folders "
                              f"of {path}; save the dataset again with save_to_disk")
    else:
        folders = [path]
    for folder in folders:
        _split_files(folder)
    try:
        return datasets.load_from_disk(str(path))
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is not a readable save_to_disk folder "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); save the "
                          "dataset again with save_to_disk") from None
