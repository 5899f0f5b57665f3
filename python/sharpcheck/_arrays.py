"""Arrays at the boundary: what a user passes (NumPy, PyTorch, JAX, CuPy, lists) handed to the C++
core without copies where the memory is already on the host, and results handed back in the
caller's kind of array and the requested format."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

# dtype names (numpy's and torch's spelling without the "torch." prefix) -> sharpcheck formats.
_FORMAT_OF_DTYPE = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}
FORMATS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "uint8")
_CPU_DEVICES = (1, 3)  # DLPack's kDLCPU and kDLCUDAHost: memory the host reads directly


def dtype_name(x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return ""
    return str(dtype).replace("torch.", "")


def format_of(x: Any, name: str) -> str:
    """The format an array's values are in, from its dtype; TypeError for integer bit patterns."""
    fmt = _FORMAT_OF_DTYPE.get(dtype_name(x))
    dtype = getattr(x, "dtype", None)
    if fmt is None and isinstance(dtype, np.dtype) and dtype.byteorder == ">":
        raise TypeError(f"{name}: big-endian arrays are not read; convert with "
                        f".astype({dtype.newbyteorder('<').str!r}) (dtype {dtype.str})")
    if fmt is None:
        raise TypeError(
            f"{name}: cannot tell the format from dtype {dtype_name(x) or type(x).__name__}; "
            f"pass format= (one of {', '.join(FORMATS)})"
        )
    return fmt


def check_format(fmt: str, what: str = "format") -> str:
    if fmt not in FORMATS:
        raise ValueError(f"{what} must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def host(x: Any, name: str, notes: List[str]) -> Any:
    """x as an object the C++ core reads in place: host memory, buffer protocol or DLPack.

    A tensor on a device is copied to the host once (said in `notes`); a tensor that requires grad
    is detached (no copy); lists and scalars become float64 NumPy arrays (exact)."""
    if x is None:
        raise TypeError(f"{name} is None; expected an array")
    if is_torch(x):
        layout = str(getattr(x, "layout", "torch.strided"))
        if layout != "torch.strided":  # sparse or mkldnn: no memory to read in place
            raise TypeError(f"{name}: a {layout.replace('torch.', '')} tensor is not read; pass {name}.to_dense()")
        if getattr(x, "requires_grad", False):
            x = x.detach()
        # A negative or conjugate view (x._neg_view(), x.conj()) keeps its memory unchanged and a
        # bit saying so: read as raw memory, -y would pass for y. Resolve it (one copy).
        if getattr(x, "is_neg", lambda: False)() or getattr(x, "is_conj", lambda: False)():
            notes.append(f"{name} was a negative or conjugate view and was resolved (copied)")
            x = x.resolve_neg().resolve_conj()
        if x.device.type != "cpu":
            notes.append(f"{name} was copied from {x.device} to the host")
            x = x.cpu()
        return x
    device = getattr(x, "__dlpack_device__", None)
    if device is not None and not isinstance(x, np.ndarray):
        kind = int(device()[0])
        if kind not in _CPU_DEVICES:
            notes.append(f"{name} was copied from DLPack device {kind} to the host")
            get = getattr(x, "get", None)  # CuPy
            return get() if callable(get) else np.asarray(x)
        return x
    if isinstance(x, np.ndarray) or hasattr(x, "__dlpack__"):
        return x
    try:
        memoryview(x)
        return x
    except TypeError:
        pass
    if isinstance(x, (list, tuple, float, int)):
        return np.asarray(x, dtype=np.float64)
    raise TypeError(f"{name}: expected an array (NumPy, PyTorch, JAX, DLPack or buffer protocol), got {type(x).__name__}")


def as_result(values: np.ndarray, fmt: str, like: Any) -> Any:
    """Reference values (float64 holding values of fmt) as the caller's kind of array in fmt."""
    numpy_dtype = {"fp64": np.float64, "fp32": np.float32, "fp16": np.float16}.get(fmt, np.float32)
    result = values.astype(numpy_dtype, copy=False)  # exact: every value is a value of fmt
    if is_torch(like):
        import torch

        tensor = torch.from_numpy(result)
        if fmt == "bf16":
            tensor = tensor.to(torch.bfloat16)  # exact for the same reason
        return tensor
    return result


def mask_and_bias(attn_mask: Any, notes: List[str]) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """PyTorch SDPA's attn_mask: a boolean mask (True keeps the key) or an additive float mask."""
    if attn_mask is None:
        return None, None
    if is_torch(attn_mask):
        attn_mask = attn_mask.detach().cpu()
        if dtype_name(attn_mask) == "bool":
            return attn_mask.numpy().astype(np.uint8), None
        return None, attn_mask.to(dtype=__import__("torch").float64).numpy()
    array = np.asarray(attn_mask)
    if array.dtype == np.bool_:
        return array.astype(np.uint8), None
    return None, array.astype(np.float64)
