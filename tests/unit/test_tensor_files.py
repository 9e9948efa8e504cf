"""qcal.tensor_files reads what safetensors writes, bit for bit, in every dtype qcal meets,
and refuses a file whose header does not describe it instead of reading past it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcal.errors import CheckpointError
from qcal.model.offload import DiskWeights
from qcal.tensor_files import TensorFileError, index_file, read_stored

pytestmark = pytest.mark.unit


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(5, 7, generator=gen)
    return {"f32": base, "bf16": base.bfloat16(), "f16": base.half(), "f64": base.double(),
            "i32": torch.randint(-9, 9, (3, 4), generator=gen, dtype=torch.int32),
            "u8": torch.randint(0, 255, (11,), generator=gen, dtype=torch.uint8),
            "bool": base > 0, "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4)}


def test_every_tensor_reads_back_bit_identical(tmp_path: Path) -> None:
    want = _tensors()
    save_file(want, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    index = index_file(tmp_path / "m.safetensors")
    assert sorted(index) == sorted(want)  # __metadata__ is no tensor
    for name, tensor in want.items():
        got = read_stored(index[name])
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got, tensor), name
        got.add_(1) if got.is_floating_point() else None  # writable, private memory


def _write_raw(path: Path, header: object, data: bytes, length: int | None = None) -> None:
    body = json.dumps(header).encode()
    path.write_bytes((len(body) if length is None else length).to_bytes(8, "little") + body + data)


@pytest.mark.parametrize(("header", "data", "length", "problem"), [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None,
     "outside the file"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16, None,
     "wrong size"),
    ({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16, None,
     "not one qcal reads"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16, None,
     "malformed"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16, 10**12,
     "header length"),
    ([1, 2], b"", None, "not a JSON object"),
])
def test_a_header_that_does_not_describe_its_file_is_refused(
        tmp_path: Path, header: object, data: bytes, length: int | None, problem: str) -> None:
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header, data, length)
    with pytest.raises(TensorFileError, match=problem):
        index_file(path)


def test_a_file_cut_short_after_indexing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    stored = index_file(path)["w"]
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(TensorFileError, match="cut short"):
        read_stored(stored)


def test_disk_weights_name_the_file_and_the_fix(tmp_path: Path) -> None:
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "model.safetensors"))
    weights = DiskWeights(tmp_path)
    assert torch.equal(weights.read("a.weight"), torch.ones(2, 2))
    _write_raw(tmp_path / "model.safetensors",
               {"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is unreadable .* re-convert"):
        DiskWeights(tmp_path).read("a.weight")
