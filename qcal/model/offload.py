"""Float weights re-read from the model directory, one decoder layer at a time.

`from_pretrained` memory-maps the safetensors file: every page a layer touches stays
resident in that one mapping until the *whole* model is freed, even after the layer
was quantized and its float weights dropped. Reading a layer from a fresh, short-lived
mapping (and copying it out) right before the layer is worked on means the original
mapping's pages of that layer are never touched, so the float model never becomes
resident as a whole: peak memory is one float layer, not the model.

Only valid when the in-memory layers still equal the files (a freshly loaded model);
callers opt in by passing the directory.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import torch
from torch import nn

from qcal.errors import CheckpointError, ModelNotFoundError, NumericalError
from qcal.tensor_files import StoredTensor, TensorFileError, index_file, read_stored


class DiskWeights:
    """Index of tensor name -> safetensors file of a float HF model directory."""

    def __init__(self, model_dir: Path | str) -> None:
        self.model_dir = Path(model_dir)
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise ModelNotFoundError(
                f"{self.model_dir} holds no *.safetensors to re-read layers from; pass the "
                "directory the model was loaded from, or run without offloading"
            )
        self._headers: dict[Path, dict[str, StoredTensor]] = {}
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.files = {k: self.model_dir / f for k, f in weight_map.items()}
        else:
            self.files = {}
            for f in files:
                self.files.update(dict.fromkeys(self._index(f), f))

    def read(self, name: str) -> torch.Tensor:
        """Tensor `name` as stored, in memory of its own, read without a mapping
        (qcal.tensor_files): its peak is the tensor once, not beside its mapped pages."""
        f = self.files[name]
        stored = self._index(f).get(name)
        try:
            if stored is None:
                raise TensorFileError(f"it holds no tensor {name}, which the index names")
            return read_stored(stored)
        except (OSError, TensorFileError) as err:
            raise _unreadable(f, err) from None

    def _index(self, f: Path) -> dict[str, StoredTensor]:
        if f not in self._headers:
            try:
                self._headers[f] = index_file(f)
            except (OSError, TensorFileError) as err:
                raise _unreadable(f, err) from None
        return self._headers[f]

    def load_into(self, module: nn.Module, prefix: str, keep_stored: frozenset[str] = frozenset()
                  ) -> int:
        """Replace `module`'s tensors named `prefix + name` in the files with private copies
        (in each tensor's current dtype and device, or, for the names in `keep_stored`, in
        the dtype the file stores); returns how many were replaced. Works on meta tensors
        too: that is how a streamed layer is materialized."""
        own = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        names = [n for n in own if prefix + n in self.files]
        return self._load(module, prefix, names, own, keep_stored)

    def load_named(self, module: nn.Module, names: list[str]) -> int:
        """Like `load_into` with no prefix, for the listed state-dict names only."""
        own = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        return self._load(module, "", [n for n in names if n in self.files], own, frozenset())

    def _load(self, module: nn.Module, prefix: str, names: list[str],
              own: dict[str, torch.Tensor], keep_stored: frozenset[str]) -> int:
        state: dict[str, torch.Tensor] = {}
        for name in names:
            ref = own[name]
            t = self.read(prefix + name)
            dtype = t.dtype if name in keep_stored else ref.dtype
            device = "cpu" if ref.is_meta else ref.device
            state[name] = t.to(dtype=dtype, device=device)
        if state:
            module.load_state_dict(state, strict=False, assign=True)
        return len(state)


def _unreadable(f: Path, err: Exception) -> CheckpointError:
    return CheckpointError(f"weight file {f} is unreadable ({err}); restore or re-convert "
                           "the model directory")


FLOAT16_MAX = 65504.0  # the largest float16: scales and half-precision kernels hold values so


def check_finite(t: torch.Tensor, name: str, path: Path) -> None:
    """A NaN/Inf float weight, or one beyond float16's range (its quantization scales would
    be Inf), is an error naming it (for check_weight_files). Two reductions, no copy of `t`;
    both carry a NaN or an Inf through."""
    if not t.is_floating_point() or not t.numel():
        return
    high, low = float(t.amax()), float(t.amin())
    if not (math.isfinite(high) and math.isfinite(low)):
        raise NumericalError(f"weight tensor {name} in {path} holds NaN or Inf values; the model "
                             "file is corrupted: restore or re-convert it")
    largest = max(high, -low)
    if largest > FLOAT16_MAX:
        raise NumericalError(f"weight tensor {name} in {path} holds {largest:.3g}, beyond the "
                             f"range of float16 (+-{FLOAT16_MAX:g}) that quantization scales use; "
                             "no trained model has such weights: restore or re-convert the file")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 256 * 1024 * 1024


def return_freed_memory() -> None:
    """Make freed tensors go back to the OS (glibc only; a no-op elsewhere).

    A layer-wise run frees a float layer and many multi-MB temporaries per layer while
    long-lived quantized buffers are allocated in between. glibc's *dynamic* mmap
    threshold (it rises to the size of any freed mmapped chunk, up to 32 MiB) then puts
    those tensors in the heap, whose holes are never returned, and the resident size
    creeps with depth. Fixing the thresholds is process-wide and lasts; it only changes
    where blocks come from, never a result (GPTQ codes are identical at every setting).

    The price of a low mmap threshold is system time: every larger temporary is a fresh
    mapping whose pages are faulted in and zeroed again. Measured on the default model,
    32 x 512 calibration tokens, idle 2-core machine (quantize seconds / peak RSS MiB;
    the float file is 513 MiB, the budget 2x that):

    | mmap / trim threshold | GPTQ (system s) | AWQ g64 (system s) |
    |---|---|---|
    | 256 KiB / default     | 73.2 / 898 (36) | 146.4 / 843 (101) |
    | 4 MiB / 256 MiB       | 67.6 / 935 (29) | 126.5 / 956 (68)  |
    | 8 MiB / 256 MiB       | 66.3 / 975 (27) | -                 |
    | 16 MiB / 256 MiB      | 58.0 / 1063 (13)| -                 |
    | 32 MiB / 256 MiB      | 53.1 / 1108 (5) | 101.5 / 1163 (-)  |

    4 MiB keeps both methods under the budget, flat in depth apart from the quantized
    layers themselves (~2 MB each), with most of the speed-up. The high trim threshold keeps
    the heap top mapped inside a layer (malloc_trim below returns it after each layer).
    """
    libc = fix_heap_thresholds()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


def fix_heap_thresholds() -> ctypes.CDLL | None:
    """Set glibc's mmap and trim thresholds (see `return_freed_memory`); returns the C
    library where that worked, None elsewhere. Loading a model calls it first, so a
    checkpoint read module by module does not leave the modules' freed temporaries in a
    fragmented heap either (an 8B checkpoint's 4.98 GiB of tensors took 7.1 GiB without)."""
    try:
        # The symbols the process already has (libc among them): ctypes.util.find_library
        # would run ldconfig in a subprocess at every call, once per layer.
        libc = ctypes.CDLL(None)
        done = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        return None
    return libc if done else None
