"""The binary payload of one experience chunk: stream field ``d`` (see :mod:`surreal_redis.hub.experience.wire`).

Layout::

    b"SRC1" | u16 template length | u32 T | u32 F | u8 flags | template | body

- ``T``: steps; ``F``: episodes that ended inside the chunk (one final observation each, in step
  order; the steps are those where ``terminated | truncated``).
- ``template``: compact JSON describing everything that is the same for every chunk of one
  sender: the observation tree (structure; per leaf dtype, shape and whether it is referenced by
  digest), the action dtype/shape, the extras (name, dtype, shape) and the recurrent-state tree.
  Senders build it once; receivers parse and validate each distinct template once and cache it.
- ``body``: the arrays, raw little-endian, concatenated in :attr:`Layout.slots` order (sorted by
  item size, largest first, so every array starts aligned), lz4-block-compressed as a whole when
  ``flags & FLAG_LZ4``:

      obs leaf            inline: dtype [T+1, ...];  referenced: uint8 [T+1] indices into ``o``
      actions             dtype [T, ...]
      rewards             float32 [T]
      terminated          bool [T]
      truncated           bool [T]
      policy version      int64 [1] when ``flags & FLAG_ONE_VERSION`` (same for every step), else [T]
      extras              dtype [T, ...] each
      recurrent state     dtype [...] each leaf (no time axis)
      final obs leaf      inline: dtype [F, ...];    referenced: uint8 [F]

Decoding checks the template (allow-listed dtypes, bounded shapes, a well-formed tree) and that
the body has exactly the size the template, T and F give, before any array is built; nothing in
the payload is ever executed or unpickled.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import lz4.block
import numpy as np

from surreal_redis.codec import DTYPE_BY_NAME, MAX_DEPTH, MAX_LEAF_BYTES, MAX_NDIM, CodecError, Tree
from surreal_redis.trees import tree_leaves, tree_structure, tree_unflatten

MAGIC = b"SRC1"
_HEAD = struct.Struct("<4sHIIB")
FLAG_LZ4 = 1
FLAG_ONE_VERSION = 2
MAX_TEMPLATE_BYTES = 65535
# JSON nesting of a template: two brackets per tree level, a few around them. Checked before the
# JSON is parsed, so a template of 65535 "[" never reaches the (recursive) parser.
MAX_TEMPLATE_NESTING = 2 * MAX_DEPTH + 8
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
INDEX_DTYPE = np.dtype(np.uint8)  # referenced leaves index the chunk's digests, at most 256 of them
_LZ4_MAX_RATIO = 255  # an lz4 block never inflates more than this (bounds the allocation)
_NAME_OF = {dtype: name for name, dtype in DTYPE_BY_NAME.items()}

# Slot groups, with the rows each has: T+1, T, F, one, or one/T (policy version).
OBS, ACTIONS, REWARDS, TERMINATED, TRUNCATED, VERSION, EXTRAS, STATE, FINAL = range(9)
_ROWS = {OBS: "T1", ACTIONS: "T", REWARDS: "T", TERMINATED: "T", TRUNCATED: "T", VERSION: "V",
         EXTRAS: "T", STATE: "1", FINAL: "F"}


class Slot(NamedTuple):
    """One array of the body: ``group`` (OBS, ACTIONS, ...), ``index`` (leaf ordinal or extras
    position), dtype and per-row shape, and its bytes per row."""

    group: int
    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing calls on a Slot
    dtype: np.dtype
    shape: tuple[int, ...]
    row_bytes: int


class Leaf(NamedTuple):
    """An observation leaf: dtype and per-step shape, and whether it is referenced by digest."""

    dtype: np.dtype
    shape: tuple[int, ...]
    ref: bool


class Decoded(NamedTuple):
    """A decoded payload: ``arrays[(group, index)]`` are views of one writable buffer."""

    layout: Layout
    steps: int
    finals: int
    arrays: dict[tuple[int, int], np.ndarray]


# ---------------------------------------------------------------- tree structure

def _builder(structure: Any, count: int) -> Callable[[list], Tree]:
    """A function leaves -> tree for a validated structure with ``count`` leaves."""
    seen: list[int] = []

    def check(node: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise CodecError(f"template tree deeper than {MAX_DEPTH}")
        if isinstance(node, int) and not isinstance(node, bool):
            seen.append(node)
            return
        if not isinstance(node, dict) or len(node) != 1:
            raise CodecError(f"malformed template tree node {node!r:.80}")
        (kind, value), = node.items()
        if kind == "d" and isinstance(value, dict):
            for child in value.values():
                check(child, depth + 1)
        elif kind in ("u", "l") and isinstance(value, list):
            for child in value:
                check(child, depth + 1)
        else:
            raise CodecError(f"malformed template tree node kind {kind!r}")

    check(structure, 0)
    if seen != list(range(count)):
        raise CodecError(f"template tree leaves {seen[:8]} are not 0..{count - 1} in order")
    return lambda leaves: tree_unflatten(structure, leaves)


def _spec(value: Any, what: str) -> tuple[np.dtype, tuple[int, ...]]:
    if not (isinstance(value, list) and len(value) == 2 and value[0] in DTYPE_BY_NAME
            and isinstance(value[1], list) and len(value[1]) <= MAX_NDIM
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in value[1])):
        raise CodecError(f"template {what}: bad [dtype, shape] {value!r:.80}")
    dtype, shape = DTYPE_BY_NAME[value[0]], tuple(value[1])
    if math.prod(shape) * dtype.itemsize > MAX_LEAF_BYTES:
        raise CodecError(f"template {what}: rows of {shape} {value[0]} exceed {MAX_LEAF_BYTES} bytes")
    return dtype, shape


def dtype_name(dtype: np.dtype) -> str:
    """The allow-listed name of a little-endian dtype; ValueError for others."""
    name = _NAME_OF.get(np.dtype(dtype))
    if name is None:
        raise ValueError(f"dtype {dtype} cannot travel (allowed: little-endian {', '.join(DTYPE_BY_NAME)})")
    return name


# ---------------------------------------------------------------- layout

class Layout:
    """The compiled template of one sender's chunks: what the body holds and where.

    Build it with :meth:`create` (sender) or :meth:`parse` (receiver; validates). ``template``
    is the JSON bytes carried by every chunk.
    """

    def __init__(self, template: bytes, obs: Any, leaves: list[Leaf], actions: tuple[np.dtype, tuple],
                 extras: list[tuple[str, np.dtype, tuple]], state: Any, state_leaves: list[tuple[np.dtype, tuple]]) -> None:
        self.template = template
        self.leaves, self.extras, self.state_leaves = leaves, extras, state_leaves
        groups: dict[tuple, list[int]] = {}
        for i, leaf in enumerate(leaves):
            if leaf.ref:
                groups.setdefault((leaf.dtype.str, leaf.shape), []).append(i)
        self.ref_groups = list(groups.values())  # referenced leaves grouped by (dtype, shape)
        self.build_obs = _builder(obs, len(leaves))
        self.build_state = None if state is None else _builder(state, len(state_leaves))
        slots = [Slot(OBS, i, INDEX_DTYPE if leaf.ref else leaf.dtype, () if leaf.ref else leaf.shape, 0)
                 for i, leaf in enumerate(leaves)]
        slots += [Slot(ACTIONS, 0, *actions, 0), Slot(REWARDS, 0, np.dtype("<f4"), (), 0),
                  Slot(TERMINATED, 0, np.dtype(bool), (), 0), Slot(TRUNCATED, 0, np.dtype(bool), (), 0),
                  Slot(VERSION, 0, np.dtype("<i8"), (), 0)]
        slots += [Slot(EXTRAS, i, dtype, shape, 0) for i, (_, dtype, shape) in enumerate(extras)]
        slots += [Slot(STATE, i, dtype, shape, 0) for i, (dtype, shape) in enumerate(state_leaves)]
        slots += [Slot(FINAL, s.index, s.dtype, s.shape, 0) for s in slots[:len(leaves)]]
        slots = [s._replace(row_bytes=s.dtype.itemsize * math.prod(s.shape)) for s in slots]
        # Largest items first: each array then starts at a multiple of its item size.
        self.slots = sorted(slots, key=lambda s: -s.dtype.itemsize)
        self._per = {rows: sum(s.row_bytes for s in slots if _ROWS[s.group] == rows) for rows in set(_ROWS.values())}
        # what decode() walks: (key, dtype, shape, rows kind, bytes per row, bool?)
        self._plan = [((s.group, s.index), s.dtype, s.shape, _ROWS[s.group], s.row_bytes, s.dtype == np.bool_)
                      for s in self.slots]

    def nbytes(self, steps: int, finals: int, one_version: bool) -> int:
        """Body size of a chunk of ``steps`` steps and ``finals`` ended episodes."""
        per = self._per
        return (per["T1"] * (steps + 1) + per["T"] * steps + per["F"] * finals + per["1"]
                + per["V"] * (1 if one_version else steps))

    @classmethod
    def create(cls, obs: Tree, leaves: list[Leaf], actions: tuple[np.dtype, tuple],
               extras: list[tuple[str, np.dtype, tuple]], state: Tree | None) -> Layout:
        """Sender side: ``obs`` and ``state`` are example trees (only their structure is used;
        ``state`` leaves give the recurrent-state dtypes and shapes)."""
        state_leaves = [] if state is None else [(x.dtype, x.shape) for x in map(np.asarray, tree_leaves(state))]
        doc: dict[str, Any] = {
            "o": tree_structure(obs),
            "l": [[dtype_name(leaf.dtype), list(leaf.shape), int(leaf.ref)] for leaf in leaves],
            "a": [dtype_name(actions[0]), list(actions[1])],
            "x": [[name, dtype_name(dtype), list(shape)] for name, dtype, shape in extras],
        }
        if state is not None:
            doc["s"] = tree_structure(state)
            doc["sl"] = [[dtype_name(dtype), list(shape)] for dtype, shape in state_leaves]
        template = json.dumps(doc, separators=(",", ":")).encode()
        if len(template) > MAX_TEMPLATE_BYTES:
            raise ValueError(f"chunk template of {len(template)} bytes exceeds {MAX_TEMPLATE_BYTES}")
        return cls(template, doc["o"], leaves, actions, extras, doc.get("s"), state_leaves)

    @classmethod
    def parse(cls, template: bytes) -> Layout:
        """Receiver side: validate and compile a template; CodecError when malformed (nested
        deeper than ``MAX_TEMPLATE_NESTING`` included)."""
        depth = _nesting(template)
        if depth > MAX_TEMPLATE_NESTING:
            raise CodecError(f"chunk template nested {depth} deep, more than {MAX_TEMPLATE_NESTING}")
        try:
            doc = json.loads(template)
        except ValueError as exc:
            raise CodecError(f"unreadable chunk template: {exc}") from None
        if not isinstance(doc, dict) or not {"o", "l", "a", "x"} <= set(doc) or not set(doc) <= {"o", "l", "a", "x", "s", "sl"}:
            raise CodecError(f"chunk template has keys {sorted(doc) if isinstance(doc, dict) else doc!r:.80}")
        if not isinstance(doc["l"], list) or not isinstance(doc["x"], list) or ("s" in doc) != ("sl" in doc):
            raise CodecError("chunk template: malformed leaf, extras or state lists")
        leaves = []
        for i, item in enumerate(doc["l"]):
            if not (isinstance(item, list) and len(item) == 3 and item[2] in (0, 1)):
                raise CodecError(f"template obs leaf {i}: bad spec {item!r:.80}")
            leaves.append(Leaf(*_spec(item[:2], f"obs leaf {i}"), bool(item[2])))
        extras = []
        for item in doc["x"]:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
                raise CodecError(f"template extras: bad spec {item!r:.80}")
            extras.append((item[0], *_spec(item[1:], f"extras {item[0]!r}")))
        if len({name for name, _, _ in extras}) != len(extras):
            raise CodecError("template extras names repeat")
        state_leaves = []
        if "sl" in doc:
            if not isinstance(doc["sl"], list):
                raise CodecError("chunk template: malformed state leaves")
            state_leaves = [_spec(item, f"state leaf {i}") for i, item in enumerate(doc["sl"])]
        return cls(bytes(template), doc["o"], leaves, _spec(doc["a"], "actions"), extras, doc.get("s"), state_leaves)


def _nesting(template: bytes) -> int:
    """Deepest bracket nesting of JSON text (brackets inside strings do not count)."""
    text = np.frombuffer(_JSON_STRING.sub(b'""', bytes(template)), np.uint8)
    if not len(text):
        return 0
    opens = (text == ord("[")) | (text == ord("{"))
    closes = (text == ord("]")) | (text == ord("}"))
    return int(np.cumsum(opens.astype(np.int32) - closes).max())


# ---------------------------------------------------------------- encode / decode

def encode(layout: Layout, steps: int, finals: int, arrays: Callable[[Slot], np.ndarray], one_version: bool,
           compress_min_bytes: int | None) -> bytes:
    """The payload of one chunk: ``arrays(slot)`` gives each slot's array, C-contiguous, of the
    slot's dtype and ``rows x shape``. The body is lz4-compressed when it is at least
    ``compress_min_bytes`` (None: never) and that shrinks it."""
    body = b"".join([arrays(slot).data for slot in layout.slots])  # TypeError if one is not contiguous
    expected = layout.nbytes(steps, finals, one_version)
    if len(body) != expected:
        raise ValueError(f"chunk body has {len(body)} bytes, its layout needs {expected}")
    flags = FLAG_ONE_VERSION if one_version else 0
    if compress_min_bytes is not None and len(body) >= compress_min_bytes:
        packed = lz4.block.compress(body, store_size=False)
        if len(packed) < len(body):
            body, flags = packed, flags | FLAG_LZ4
    return b"".join((_HEAD.pack(MAGIC, len(layout.template), steps, finals, flags), layout.template, body))


def _header(view: memoryview, layouts: dict[bytes, Layout], max_layouts: int) -> tuple[Layout, int, int, int, int]:
    """(layout, steps, finals, flags, template length) of a payload; CodecError when malformed."""
    if len(view) < _HEAD.size:
        raise CodecError(f"chunk payload of {len(view)} bytes is too short")
    magic, tlen, steps, finals, flags = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise CodecError(f"not a chunk payload (magic {bytes(magic)!r})")
    if flags & ~(FLAG_LZ4 | FLAG_ONE_VERSION) or len(view) < _HEAD.size + tlen:
        raise CodecError(f"bad chunk payload header (flags {flags}, template {tlen} bytes)")
    template = bytes(view[_HEAD.size:_HEAD.size + tlen])
    layout = layouts.get(template)
    if layout is None:
        layout = Layout.parse(template)
        if len(layouts) >= max_layouts:
            layouts.clear()
        layouts[template] = layout
    return layout, steps, finals, flags, tlen


def declared_nbytes(data: bytes, layouts: dict[bytes, Layout], max_layouts: int = 1024) -> int:
    """The bytes :func:`decode` would allocate for this payload's arrays, read from its header and
    template without touching its body (so a reader can refuse or defer it first). Raises
    CodecError when the header or template is malformed."""
    layout, steps, finals, flags, _ = _header(memoryview(data), layouts, max_layouts)
    return layout.nbytes(steps, finals, bool(flags & FLAG_ONE_VERSION))


def decode(data: bytes, layouts: dict[bytes, Layout], max_layouts: int = 1024) -> Decoded:
    """Inverse of :func:`encode`; ``layouts`` caches parsed templates (at most ``max_layouts``).
    Raises CodecError on anything malformed. The arrays share one freshly allocated, writable
    buffer per chunk."""
    view = memoryview(data)
    layout, steps, finals, flags, tlen = _header(view, layouts, max_layouts)
    one_version = bool(flags & FLAG_ONE_VERSION)
    expected = layout.nbytes(steps, finals, one_version)
    body = view[_HEAD.size + tlen:]
    if flags & FLAG_LZ4:
        if expected > _LZ4_MAX_RATIO * len(body) + 64 or expected > MAX_LEAF_BYTES:
            raise CodecError(f"lz4 body of {len(body)} bytes cannot inflate to the declared {expected}")
        try:
            buf = lz4.block.decompress(body, uncompressed_size=expected, return_bytearray=True)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"corrupt lz4 chunk body: {exc}") from None
        if len(buf) != expected:
            raise CodecError(f"chunk body inflates to {len(buf)} bytes, its layout needs {expected}")
    elif len(body) != expected:
        raise CodecError(f"chunk body has {len(body)} bytes, its layout needs {expected}")
    else:
        buf = bytearray(body)
    rows = {"T1": steps + 1, "T": steps, "F": finals, "1": 1, "V": 1 if one_version else steps}
    arrays = {}
    offset = 0
    for key, dtype, shape, kind, row_bytes, is_bool in layout._plan:
        n = rows[kind]
        size = n * row_bytes
        if is_bool and buf[offset:offset + size].translate(None, b"\0\1"):
            raise CodecError(f"bool array {key} holds bytes other than 0 and 1")
        arrays[key] = np.ndarray(shape if kind == "1" else (n, *shape), dtype, buf, offset)
        offset += size
    return Decoded(layout, steps, finals, arrays)
