"""Pickle-free encoding of numpy arrays and nested dicts/lists/tuples of arrays.

Wire format of a tree (``encode_tree``)::

    b"SRT1" | u32 header length | JSON header | leaf bytes, concatenated

The JSON header holds the tree structure and, for every array leaf, its dtype (from an
allow-list), shape, stored byte count and codec (``raw`` or ``lz4``). Decoding checks every one of
those against the buffer before touching the data, so hostile bytes raise :class:`CodecError`,
never execute anything and never allocate more than the declared (and capped) sizes.

A single array (``encode_array``) uses a smaller fixed header: it is what each deduplicated
observation leaf or frame is stored as.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import lz4.block
import numpy as np

from surreal_redis.trees import Tree

TREE_MAGIC = b"SRT1"
ARRAY_MAGIC = b"SRA1"
MAX_HEADER_BYTES = 1 << 20
MAX_LEAF_BYTES = 1 << 31
MAX_DEPTH = 32
MAX_NDIM = 16

# dtype allow-list: code <-> little-endian numpy dtype.
_DTYPES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64",
]
DTYPE_BY_NAME = {name: np.dtype(name).newbyteorder("<") for name in _DTYPES}
_CODE_BY_NAME = {name: i for i, name in enumerate(_DTYPES)}
# dtype.name costs microseconds on numpy 2 and is asked several times per leaf; a lookup is free.
_NAME_BY_DTYPE = {np.dtype(name): name for name in _DTYPES}
_ARRAY_HEADER = struct.Struct("<4sBBB")  # magic, codec, dtype code, ndim
_CODECS = ("raw", "lz4")

ParamDict = dict[str, np.ndarray]  # flat name -> array: what parameter blobs hold


class CodecError(ValueError):
    """Bytes that do not decode: wrong magic, disallowed dtype, inconsistent sizes, bad lz4 data."""


def digest(data: bytes | memoryview) -> str:
    """Content digest used for observation keys: blake2b-128, 32 hex characters."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _dtype_name(arr: np.ndarray) -> str:
    name = _NAME_BY_DTYPE.get(arr.dtype) or arr.dtype.name
    if name not in DTYPE_BY_NAME:
        raise CodecError(f"dtype {arr.dtype} is not allowed (allowed: {', '.join(_DTYPES)})")
    return name


def _pack(arr: np.ndarray, compress_min_bytes: int | None) -> tuple[bytes, str]:
    data = np.ascontiguousarray(arr, dtype=DTYPE_BY_NAME[_dtype_name(arr)]).tobytes()
    if compress_min_bytes is not None and len(data) >= compress_min_bytes:
        packed = lz4.block.compress(data, store_size=False)
        if len(packed) < len(data):
            return packed, "lz4"
    return data, "raw"


def _unpack(stored: bytes | memoryview, codec: str, dtype: np.dtype, shape: tuple[int, ...],
            copy: bool = True) -> np.ndarray:
    expected = math.prod(shape) * dtype.itemsize
    if expected > MAX_LEAF_BYTES:
        raise CodecError(f"declared array of {expected} bytes exceeds the {MAX_LEAF_BYTES} limit")
    if codec == "raw":
        if len(stored) != expected:
            raise CodecError(f"array data has {len(stored)} bytes, header declares {expected}")
        raw = stored
    elif codec == "lz4":
        try:
            raw = lz4.block.decompress(stored, uncompressed_size=expected)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"corrupt lz4 data: {exc}") from None
        if len(raw) != expected:
            raise CodecError(f"lz4 data inflates to {len(raw)} bytes, header declares {expected}")
    else:
        raise CodecError(f"unknown codec {codec!r}")
    # frombuffer on bytes gives a read-only view; copy so callers own writable memory (unless
    # they asked for views: a fresh copy of a large blob costs its page faults again).
    view = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return view.copy() if copy else view


def _check_shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM or \
            not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape):
        raise CodecError(f"bad array shape {shape!r}")
    return tuple(shape)


# ---------------------------------------------------------------- single arrays

def encode_array(arr: np.ndarray, compress_min_bytes: int | None = None) -> bytes:
    """Encode one array; lz4 is used when it is at least ``compress_min_bytes`` and shrinks."""
    arr = np.asarray(arr)
    if arr.ndim > MAX_NDIM:
        raise CodecError(f"array with {arr.ndim} dimensions exceeds {MAX_NDIM}")
    data, codec = _pack(arr, compress_min_bytes)
    return _array_prefix(_CODECS.index(codec), _dtype_name(arr), arr.shape) + data


@lru_cache(maxsize=1024)
def _array_prefix(codec: int, name: str, shape: tuple[int, ...]) -> bytes:
    """Header and shape of an encoded array (the same for every frame of one observation)."""
    header = _ARRAY_HEADER.pack(ARRAY_MAGIC, codec, _CODE_BY_NAME[name], len(shape))
    return header + struct.pack(f"<{len(shape)}I", *shape)


def encode_raw(data: bytes | memoryview | np.ndarray, dtype: np.dtype, shape: tuple[int, ...],
               compress_min_bytes: int | None = None) -> bytes:
    """:func:`encode_array` of the array whose C-order little-endian bytes are ``data`` (for
    callers that already hold them: no second copy). ``data`` may be any C-contiguous buffer, a
    numpy array of that dtype included: it is compressed straight from it (copied only when it
    travels raw)."""
    name = _NAME_BY_DTYPE.get(dtype)
    size = data.nbytes if isinstance(data, (memoryview, np.ndarray)) else len(data)
    if name is None or len(shape) > MAX_NDIM or size != math.prod(shape) * dtype.itemsize:
        raise CodecError(f"cannot encode {size} bytes as {dtype}{tuple(shape)}")
    if compress_min_bytes is not None and size >= compress_min_bytes:
        packed = lz4.block.compress(data, store_size=False)
        if len(packed) < size:
            return _array_prefix(1, name, tuple(shape)) + packed
    return _array_prefix(0, name, tuple(shape)) + bytes(data)


def array_header(buf: bytes | memoryview) -> tuple[np.dtype, tuple[int, ...], str, int]:
    """(dtype, shape, codec, data offset) of an :func:`encode_array` blob, read without touching
    its data (so a reader can check them before decompressing); CodecError when malformed."""
    view = memoryview(buf)
    if len(view) < _ARRAY_HEADER.size:
        raise CodecError(f"array blob of {len(view)} bytes is too short")
    magic, codec, code, ndim = _ARRAY_HEADER.unpack_from(view)
    if magic != ARRAY_MAGIC:
        raise CodecError(f"not an encoded array (magic {bytes(magic)!r})")
    if codec >= len(_CODECS) or code >= len(_DTYPES) or ndim > MAX_NDIM:
        raise CodecError(f"bad array header (codec {codec}, dtype {code}, ndim {ndim})")
    start = _ARRAY_HEADER.size + 4 * ndim
    if len(view) < start:
        raise CodecError("array blob is truncated inside its shape")
    shape = struct.unpack_from(f"<{ndim}I", view, _ARRAY_HEADER.size)
    return DTYPE_BY_NAME[_DTYPES[code]], shape, _CODECS[codec], start


def max_encoded_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """The most bytes an :func:`encode_array` blob of ``dtype`` and ``shape`` holds: its header and
    the raw data (lz4 is kept only when it is smaller), so a reader may refuse a bigger blob unread."""
    return _ARRAY_HEADER.size + 4 * len(shape) + math.prod(shape) * np.dtype(dtype).itemsize


def decode_array(buf: bytes | memoryview) -> np.ndarray:
    """Inverse of :func:`encode_array`; raises :class:`CodecError` on anything malformed."""
    dtype, shape, codec, start = array_header(buf)
    return _unpack(memoryview(buf)[start:], codec, dtype, shape)


# ---------------------------------------------------------------- trees

def encode_tree(tree: Tree, compress_min_bytes: int | None = None) -> bytes:
    """Encode a nested dict (str keys) / list / tuple of arrays and JSON scalars."""
    leaves: list[list[Any]] = []
    chunks: list[bytes] = []

    def walk(node: Tree, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CodecError(f"tree deeper than {MAX_DEPTH}")
        if isinstance(node, (np.ndarray, np.generic)):
            arr = np.asarray(node)
            data, codec = _pack(arr, compress_min_bytes)
            leaves.append([_dtype_name(arr), list(arr.shape), len(data), codec])
            chunks.append(data)
            return {"a": len(leaves) - 1}
        if isinstance(node, Mapping):
            if not all(isinstance(k, str) for k in node):
                raise CodecError("tree dict keys must be strings")
            return {"d": {k: walk(v, depth + 1) for k, v in node.items()}}
        if isinstance(node, (tuple, list)):
            return {"u" if isinstance(node, tuple) else "l": [walk(v, depth + 1) for v in node]}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"s": node}
        raise CodecError(f"cannot encode {type(node).__name__} (only arrays, scalars, dict/list/tuple)")

    structure = walk(tree, 0)
    header = json.dumps({"t": structure, "l": leaves}, separators=(",", ":")).encode()
    return b"".join([TREE_MAGIC, struct.pack("<I", len(header)), header, *chunks])


def decode_tree(buf: bytes | memoryview, copy: bool = True) -> Tree:
    """Inverse of :func:`encode_tree`; raises :class:`CodecError` on anything malformed.

    With ``copy=False`` the arrays are read-only views of ``buf`` (raw leaves) or of their
    decompressed bytes (lz4 leaves): no second copy of a large blob."""
    view = memoryview(buf)
    if len(view) < 8 or bytes(view[:4]) != TREE_MAGIC:
        raise CodecError("not an encoded tree (bad magic or too short)")
    (header_len,) = struct.unpack_from("<I", view, 4)
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(view):
        raise CodecError(f"tree header length {header_len} does not fit the {len(view)}-byte buffer")
    try:
        header = json.loads(bytes(view[8 : 8 + header_len]))
        structure, leaf_specs = header["t"], header["l"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"unreadable tree header: {exc}") from None
    if not isinstance(leaf_specs, list):
        raise CodecError("tree header leaf list is not a list")
    offset = 8 + header_len
    arrays = []
    for i, spec in enumerate(leaf_specs):
        if not (isinstance(spec, list) and len(spec) == 4):
            raise CodecError(f"leaf {i}: malformed spec {spec!r}")
        name, shape, nbytes, codec = spec
        if name not in DTYPE_BY_NAME:
            raise CodecError(f"leaf {i}: dtype {name!r} is not allowed")
        if not isinstance(nbytes, int) or nbytes < 0 or offset + nbytes > len(view):
            raise CodecError(f"leaf {i}: {nbytes!r} bytes do not fit the buffer")
        arrays.append(_unpack(view[offset : offset + nbytes], codec, DTYPE_BY_NAME[name], _check_shape(shape), copy))
        offset += nbytes
    if offset != len(view):
        raise CodecError(f"{len(view) - offset} trailing bytes after the last leaf")
    used = set()

    def build(node: Any, depth: int) -> Tree:
        if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
            raise CodecError("malformed tree structure")
        (kind, value), = node.items()
        if kind == "a":
            if not isinstance(value, int) or not 0 <= value < len(arrays) or value in used:
                raise CodecError(f"bad leaf reference {value!r}")
            used.add(value)
            arr = arrays[value]
            return arr[()] if arr.ndim == 0 else arr
        if kind == "d" and isinstance(value, dict):
            return {str(k): build(v, depth + 1) for k, v in value.items()}
        if kind in ("l", "u") and isinstance(value, list):
            items = [build(v, depth + 1) for v in value]
            return items if kind == "l" else tuple(items)
        if kind == "s" and (value is None or isinstance(value, (bool, int, float, str))):
            return value
        raise CodecError(f"malformed tree node kind {kind!r}")

    result = build(structure, 0)
    if len(used) != len(arrays):
        raise CodecError("tree header lists leaves that the structure never uses")
    return result
