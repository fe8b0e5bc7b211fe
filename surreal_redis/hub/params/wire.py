"""The parameter wire format, and how a client checks and decodes what it read.

- ``blob:<v>``: the parameters as :func:`surreal_redis.codec.encode_tree` bytes (optionally lz4
  per leaf). A published blob never changes.
- ``meta``: hash ``version nbytes piece digest codec spec iteration time message``. ``spec``
  (JSON ``{name: [dtype, shape]}``) gives the shapes and the learner's dtypes without a download;
  with ``hub.publisher.dtype: float16`` float32 leaves travel as float16 (:func:`to_wire`),
  ``codec`` ends in ``+float16`` and clients cast them back (:func:`from_wire`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import xxhash

from surreal_redis.codec import ParamDict, decode_tree
from surreal_redis.connection import as_text

log = logging.getLogger(__name__)

CODEC = "srt1"  # the encode_tree format; "+lz4" is appended when leaves may be compressed
# The digest guards against corruption, not forgery: only the learner's Redis user can write
# parameter keys (acl.py). XXH3-128, because sha256 cost as much as the download itself.
DIGEST_ALGO = "xxh3_128"
MAX_BLOB_BYTES = 512 * 1024 * 1024  # Redis proto-max-bulk-len: the largest string a key can hold
# 1 MiB reads keep each agent's share of Redis' client output buffers to a few pieces
DEFAULT_PIECE_BYTES = 1 << 20
WIRE_DTYPES = ("float32", "float16")  # PublisherConfig.dtype: what float32 leaves travel as
# "+float16": float32 leaves travel as float16 (older clients refuse it as unknown)
CODECS = frozenset(CODEC + lz4 + wire for lz4 in ("", "+lz4") for wire in ("", "+float16"))


class ParamFetchError(RuntimeError):
    """A parameter download that cannot be used: blob missing or expired, wrong size, digest
    mismatch, unknown codec or malformed metadata."""


def blob_digest(blob: bytes | memoryview) -> str:
    """``"xxh3_128:<hex>"`` of ``blob``, as recorded in ``meta``."""
    return f"{DIGEST_ALGO}:{xxhash.xxh3_128_hexdigest(blob)}"


@dataclass(frozen=True)
class ParamInfo:
    """What is known about one parameter version. ``version`` 0 means "nothing published yet";
    ``time`` is the publish time in unix seconds; ``nbytes`` is the encoded blob size."""

    version: int
    iteration: int
    time: float
    digest: str
    nbytes: int

    @classmethod
    def nothing(cls) -> ParamInfo:
        return cls(version=0, iteration=0, time=0.0, digest="", nbytes=0)


def param_spec(params: ParamDict) -> dict[str, list]:
    """``{name: [dtype, shape]}`` of a parameter dict; raises ``TypeError`` naming a bad entry."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of name -> numpy array, got {type(params).__name__}")
    spec = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"parameter names must be non-empty strings, got {name!r}")
        if not isinstance(value, np.ndarray):
            raise TypeError(f"parameter {name!r} is a {type(value).__name__}, not a numpy array")
        spec[name] = [value.dtype.name, list(value.shape)]
    return spec


def to_wire(params: ParamDict, dtype: str) -> ParamDict:
    """``params`` as sent with ``PublisherConfig.dtype`` ``dtype``: every float32 leaf cast to
    ``dtype`` (new arrays), except one holding a finite value beyond its range (float16: 65504),
    which stays float32 like every other dtype. Raises ``ValueError`` naming a bad ``dtype``."""
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return dict(params)
    wire: ParamDict = {}
    for name, value in params.items():
        if value.dtype == np.float32:
            with np.errstate(over="ignore"):  # an overflow is seen below and kept float32
                cast = value.astype(dtype)
            if np.array_equal(np.isinf(cast), np.isinf(value)):
                wire[name] = cast
                continue
            log.debug("parameter %r has values beyond %s's range: sent as float32", name, dtype)
        wire[name] = value
    return wire


def from_wire(tree: ParamDict, spec: dict[str, list]) -> ParamDict:
    """A ``+float16`` blob's leaves with each float16 one that ``spec`` (meta's ``{name: [dtype,
    shape]}``) lists as float32 cast back (a new array). Raises :class:`ParamFetchError` for a
    leaf missing from ``spec`` or of another dtype."""
    out: ParamDict = {}
    for name, value in tree.items():
        want = spec.get(name)
        if not isinstance(want, list) or not want:
            raise ParamFetchError(f"parameter {name!r} is not in the published spec")
        if value.dtype.name == want[0]:
            out[name] = value
        elif want[0] == "float32" and value.dtype == np.float16:
            out[name] = value.astype(np.float32)
        else:
            raise ParamFetchError(f"parameter {name!r} arrived as {value.dtype.name}, the spec says {want[0]}")
    return out


def parse_meta(meta: dict[bytes | str, bytes | str]) -> tuple[ParamInfo, int, str, str]:
    """(info, read piece size, codec, spec JSON text) from a raw meta hash; empty meta gives
    version 0."""
    if not meta:
        return ParamInfo.nothing(), 0, "", ""
    try:
        fields = {as_text(k): as_text(v) for k, v in meta.items()}
        info = ParamInfo(version=int(fields["version"]), iteration=int(fields["iteration"]),
                         time=float(fields["time"]), digest=fields["digest"], nbytes=int(fields["nbytes"]))
        piece, codec, spec = int(fields["piece"]), fields["codec"], fields.get("spec", "")
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ParamFetchError(f"malformed parameter metadata {meta!r}: {exc!r}") from None
    if not (0 < info.nbytes <= MAX_BLOB_BYTES and piece >= 1024):
        raise ParamFetchError(f"implausible parameter metadata: nbytes {info.nbytes}, piece {piece}")
    return info, piece, codec, spec


def decode_params(buf: bytes | memoryview, info: ParamInfo, codec: str, spec: str) -> ParamDict:
    """The parameters in a verified blob ``buf`` of ``info``'s version, with meta's ``codec`` and
    ``spec`` (JSON text): read-only views of ``buf``, or float32 copies of float16 leaves of a
    ``+float16`` codec. Raises :class:`ParamFetchError` (or ``CodecError``) for a blob that is not
    a parameter dict or a malformed spec."""
    tree = decode_tree(buf, copy=False)  # read-only views: consumers copy into their own tensors
    if not isinstance(tree, dict):
        raise ParamFetchError(f"v{info.version}: blob holds a {type(tree).__name__}, not a parameter dict")
    params = {name: np.asarray(value) for name, value in tree.items()}
    if not codec.endswith("+float16"):
        return params
    try:  # float32 leaves travelled as float16: float32 again
        listed = json.loads(spec)
    except ValueError:
        listed = None
    if not isinstance(listed, dict):
        raise ParamFetchError(f"v{info.version}: malformed parameter spec {spec[:80]!r}")
    return from_wire(params, listed)
