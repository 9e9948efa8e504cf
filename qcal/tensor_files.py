"""Tensors of a safetensors file read into private memory with plain reads, no mapping.

`safe_open(...).get_tensor` hands out a view of a memory map; copying it out (as a
private tensor must be) makes every page of the mapping resident beside the copy until
the mapping closes, so a 151k-vocabulary embedding (0.87 GiB in float32) costs twice that
at its peak. A plain read into an array of its own goes through the page cache, which is
not the process's memory: the peak is the tensor once. Both the float model's files
(streamed quantization, export) and qcal's checkpoints are read this way.

The format is safetensors' own: an 8-byte little-endian header length, a JSON header of
dtype, shape and byte offsets per tensor, then the raw bytes. A header that does not
describe its file raises TensorFileError naming the problem; callers say what to do
about it. Plain JSON and bytes: reading never runs code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

# safetensors' dtype names -> torch dtypes.
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "U16": torch.uint16, "U32": torch.uint32,
    "U64": torch.uint64,
}
# safetensors itself refuses headers above 100 MB: no real file has one.
MAX_HEADER_BYTES = 100_000_000


class TensorFileError(ValueError):
    """A safetensors file whose header or bytes do not describe its tensors."""


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in a safetensors file."""

    file: Path
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


def index_file(path: Path | str) -> dict[str, StoredTensor]:
    """Every tensor of one file, from its header alone."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise TensorFileError(f"header length {length} does not fit a {size}-byte file")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError) as err:
            raise TensorFileError(f"its header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise TensorFileError("its header is not a JSON object")
    where = {}
    for key, entry in header.items():
        if key != "__metadata__":
            where[key] = _entry(path, key, entry, 8 + length, size)
    return where


def _entry(path: Path, key: str, entry: object, start: int, size: int) -> StoredTensor:
    if not isinstance(entry, dict):
        raise TensorFileError(f"tensor {key} has no header entry")
    dtype = DTYPES.get(str(entry.get("dtype")))
    if dtype is None:
        raise TensorFileError(f"tensor {key} has dtype {entry.get('dtype')!r}, not one qcal reads")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise TensorFileError(f"tensor {key} has a malformed shape or offsets")
    begin, end = (start + o for o in offsets)
    if end > size or end - begin != math.prod(shape) * dtype.itemsize:
        raise TensorFileError(f"tensor {key} lies outside the file or has the wrong size")
    return StoredTensor(path, key, dtype, tuple(shape), begin, end)


def read_stored(stored: StoredTensor) -> torch.Tensor:
    """One tensor in memory of its own (see the module's docstring for why not mapped)."""
    if sys.byteorder != "little":  # the files are little-endian: let safetensors swap bytes
        from safetensors import safe_open

        with safe_open(str(stored.file), "pt") as handle:
            return handle.get_tensor(stored.key).clone()
    if stored.end == stored.begin:  # an empty tensor: no bytes to view
        return torch.empty(stored.shape, dtype=stored.dtype)
    raw = np.fromfile(stored.file, dtype=np.uint8, count=stored.end - stored.begin,
                      offset=stored.begin)
    if raw.size != stored.end - stored.begin:
        raise TensorFileError(f"the file is cut short inside tensor {stored.key}")
    return torch.from_numpy(raw).view(stored.dtype).reshape(stored.shape)
