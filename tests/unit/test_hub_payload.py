"""The chunk payload format: round trips, alignment, compression, and hostile bytes."""

import json
import struct

import numpy as np
import pytest

from surreal_redis.codec import CodecError
from surreal_redis.hub.experience import payload as pl

T, F = 5, 2
OBS = {"pix": (0, 0), "vec": 0}  # structure only: two referenced frames and an inline vector
LEAVES = [pl.Leaf(np.dtype(np.uint8), (8, 8), True), pl.Leaf(np.dtype(np.uint8), (8, 8), True),
          pl.Leaf(np.dtype("<f4"), (3,), False)]
EXTRAS = [("logp", np.dtype("<f4"), ()), ("mask", np.dtype(bool), (2,))]
STATE = {"h": np.zeros((4,), "<f8"), "c": np.zeros((), "<i2")}


def layout(state=STATE) -> pl.Layout:
    return pl.Layout.create(OBS, LEAVES, (np.dtype("<i8"), (2,)), EXTRAS, state)


def arrays(rng: np.random.Generator, one_version: bool) -> dict:
    out = {(pl.OBS, 0): rng.integers(0, 9, T + 1).astype(np.uint8), (pl.OBS, 1): rng.integers(0, 9, T + 1).astype(np.uint8),
           (pl.OBS, 2): rng.normal(size=(T + 1, 3)).astype("<f4"),
           (pl.FINAL, 0): np.array([1, 2], np.uint8), (pl.FINAL, 1): np.array([3, 4], np.uint8),
           (pl.FINAL, 2): rng.normal(size=(F, 3)).astype("<f4"),
           (pl.ACTIONS, 0): rng.integers(-5, 5, (T, 2)), (pl.REWARDS, 0): rng.normal(size=T).astype("<f4"),
           (pl.TERMINATED, 0): np.array([0, 1, 0, 0, 0], bool), (pl.TRUNCATED, 0): np.array([0, 0, 0, 1, 0], bool),
           (pl.VERSION, 0): np.array([7], "<i8") if one_version else np.arange(T, dtype="<i8"),
           (pl.EXTRAS, 0): rng.normal(size=T).astype("<f4"), (pl.EXTRAS, 1): rng.random((T, 2)) < 0.5,
           (pl.STATE, 0): rng.normal(size=4), (pl.STATE, 1): np.array(3, "<i2")}
    return out


@pytest.mark.parametrize("one_version", [True, False])
@pytest.mark.parametrize("compress", [None, 1])
def test_round_trip_every_slot(one_version, compress):
    source = arrays(np.random.default_rng(0), one_version)
    data = pl.encode(layout(), T, F, lambda s: source[s.group, s.index], one_version, compress)
    assert bool(data[struct.calcsize("<4sHII")] & pl.FLAG_LZ4) == (compress is not None)
    cache: dict = {}
    decoded = pl.decode(data, cache)
    assert len(cache) == 1 and decoded.steps == T and decoded.finals == F
    assert decoded.arrays.keys() == source.keys()
    for key, value in source.items():
        got = decoded.arrays[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        np.testing.assert_array_equal(got, value)
        assert got.flags.writeable and got.ctypes.data % got.dtype.itemsize == 0  # aligned views
    assert decoded.layout.build_obs([1, 2, 3]) == {"pix": (1, 2), "vec": 3}
    assert decoded.layout.build_state([4, 5]) == {"h": 4, "c": 5}
    assert pl.decode(data, cache).layout is decoded.layout  # one parse per template


def test_without_state_and_with_a_plain_array_observation():
    plain = pl.Layout.create(np.zeros(2), [pl.Leaf(np.dtype("<f4"), (2,), False)], (np.dtype("<i8"), ()), [], None)
    source = {pl.OBS: np.ones((3, 2), "<f4"), pl.FINAL: np.zeros((0, 2), "<f4"), pl.ACTIONS: np.arange(2),
              pl.REWARDS: np.ones(2, "<f4"), pl.TERMINATED: np.zeros(2, bool), pl.TRUNCATED: np.zeros(2, bool),
              pl.VERSION: np.array([1], "<i8")}
    decoded = pl.decode(pl.encode(plain, 2, 0, lambda s: source[s.group], True, None), {})
    assert decoded.layout.build_state is None and decoded.layout.build_obs(["x"]) == "x"
    np.testing.assert_array_equal(decoded.arrays[pl.OBS, 0], source[pl.OBS])


def test_encode_checks_sizes_and_contiguity():
    source = arrays(np.random.default_rng(1), True)
    with pytest.raises(ValueError, match="layout needs"):
        pl.encode(layout(), T + 1, F, lambda s: source[s.group, s.index], True, None)
    source[pl.OBS, 2] = np.zeros((T + 1, 6), "<f4")[:, ::2]
    with pytest.raises(TypeError):
        pl.encode(layout(), T, F, lambda s: source[s.group, s.index], True, None)
    with pytest.raises(ValueError, match="cannot travel"):
        pl.Layout.create(OBS, LEAVES, (np.dtype(">i8"), ()), [], None)


def good_payload(compress=None) -> bytes:
    source = arrays(np.random.default_rng(2), False)
    return pl.encode(layout(), T, F, lambda s: source[s.group, s.index], False, compress)


def with_template(doc) -> bytes:
    template = json.dumps(doc).encode()
    return struct.pack("<4sHIIB", pl.MAGIC, len(template), 1, 0, 0) + template


@pytest.mark.parametrize("data, match", [
    (b"SRC1", "too short"),
    (b"XXXX" + bytes(20), "not a chunk payload"),
    (struct.pack("<4sHIIB", pl.MAGIC, 10, 1, 0, 8) + bytes(10), "bad chunk payload header"),
    (struct.pack("<4sHIIB", pl.MAGIC, 3, 1, 0, 0) + b"{{{", "unreadable chunk template"),
    (with_template([1]), "keys"),
    (with_template({"o": 0, "l": [["object", [1], 0]], "a": ["int64", []], "x": []}), "bad \\[dtype, shape\\]"),
    (with_template({"o": 0, "l": [["uint8", [-1], 0]], "a": ["int64", []], "x": []}), "bad \\[dtype, shape\\]"),
    (with_template({"o": 0, "l": [["uint8", [1 << 30, 4], 0]], "a": ["int64", []], "x": []}), "exceed"),
    (with_template({"o": {"d": {"a": 0, "b": 0}}, "l": [["uint8", [1], 0]], "a": ["int64", []], "x": []}),
     "not 0..0 in order"),
    (with_template({"o": {"q": 0}, "l": [["uint8", [1], 0]], "a": ["int64", []], "x": []}), "node kind"),
    (with_template({"o": 0, "l": [["uint8", [1], 0]], "a": ["int64", []], "x": [["n", "uint8", []]] * 2}), "repeat"),
    (with_template({"o": 0, "l": [["uint8", [1], 0]], "a": ["int64", []], "x": [], "s": 0}), "state"),
    (with_template({"o": 0, "l": [["uint8", [1], 0]], "a": ["int64", []], "x": []}), "body has 0 bytes"),
])
def test_hostile_payloads_raise_codec_errors(data, match):
    with pytest.raises(CodecError, match=match):
        pl.decode(data, {})


def nested(depth: int) -> bytes:
    """A template whose observation tree is ``depth`` tuples deep."""
    tree = '{"u":[' * depth + "0" + "]}" * depth
    return ('{"o":' + tree + ',"l":[["uint8",[1],0]],"a":["int64",[]],"x":[]}').encode()


@pytest.mark.parametrize("template", [
    b"[" * 60_000,  # json.loads recursed into RecursionError (not a CodecError: it stopped the reader)
    b'{"o":' + b"[" * 60_000,
    nested(40),
])
def test_deeply_nested_templates_are_refused_before_they_are_parsed(template):
    with pytest.raises(CodecError, match="nested"):
        pl.decode(struct.pack("<4sHIIB", pl.MAGIC, len(template), 1, 0, 0) + template, {})


def test_nesting_ignores_brackets_inside_strings_and_allows_the_tree_depth_limit():
    assert pl._nesting(b'{"a[[[[": "]]{{"}') == 1
    assert pl._nesting(rb'["\\", ["\"[["]]') == 2  # an escaped backslash, then an escaped quote
    ok = nested(31)
    assert pl._nesting(ok) <= pl.MAX_TEMPLATE_NESTING
    pl.Layout.parse(ok)  # the codec's tree depth limit still applies after the nesting check


def test_truncated_or_inflated_bodies_are_refused():
    data = good_payload()
    with pytest.raises(CodecError, match="layout needs"):
        pl.decode(data[:-1], {})
    with pytest.raises(CodecError, match="layout needs"):
        pl.decode(data + b"\0", {})
    packed = bytearray(good_payload(compress=1))
    with pytest.raises(CodecError, match="lz4|inflates"):
        pl.decode(bytes(packed[:-4]), {})
    # a tiny lz4 body that claims a huge T must not allocate it
    head = struct.calcsize("<4sHIIB")
    (tlen,) = struct.unpack_from("<H", packed, 4)
    bomb = struct.pack("<4sHIIB", pl.MAGIC, tlen, 1 << 30, 0, pl.FLAG_LZ4) + bytes(packed[head:head + tlen]) + b"\0" * 16
    with pytest.raises(CodecError, match="cannot inflate"):
        pl.decode(bomb, {})


def test_template_cache_is_bounded():
    cache: dict = {}
    for width in range(1, 5):
        plain = pl.Layout.create(0, [pl.Leaf(np.dtype("<f4"), (width,), False)], (np.dtype("<i8"), ()), [], None)
        source = {pl.OBS: np.zeros((2, width), "<f4"), pl.FINAL: np.zeros((0, width), "<f4"), pl.ACTIONS: np.zeros(1, "<i8"),
                  pl.REWARDS: np.zeros(1, "<f4"), pl.TERMINATED: np.zeros(1, bool), pl.TRUNCATED: np.zeros(1, bool),
                  pl.VERSION: np.zeros(1, "<i8")}
        pl.decode(pl.encode(plain, 1, 0, lambda s, src=source: src[s.group], True, None), cache, max_layouts=2)
        assert len(cache) <= 2


def test_encode_raw_matches_encode_array():
    from surreal_redis.codec import decode_array, encode_array, encode_raw

    frame = np.tile(np.arange(84, dtype=np.uint8), (84, 1))
    for compress in (None, 512):
        blob = encode_raw(frame.tobytes(), frame.dtype, frame.shape, compress)
        assert blob == encode_array(frame, compress)
        np.testing.assert_array_equal(decode_array(blob), frame)
    assert len(encode_raw(frame.tobytes(), frame.dtype, frame.shape, 512)) < frame.nbytes // 4
    with pytest.raises(CodecError, match="cannot encode"):
        encode_raw(frame.tobytes()[:-1], frame.dtype, frame.shape)
    with pytest.raises(CodecError, match="cannot encode"):
        encode_raw(b"x" * 8, np.dtype(object), (1,))


def test_encode_raw_reads_a_contiguous_array_in_place():
    from surreal_redis.codec import encode_array, encode_raw

    frames = [np.tile(np.arange(84, dtype=np.uint8), (84, 1)), np.random.default_rng(0).random((30, 40), np.float32)]
    for frame in frames:
        for compress in (None, 512):
            assert encode_raw(frame, frame.dtype, frame.shape, compress) == encode_array(frame, compress)
            assert encode_raw(memoryview(frame), frame.dtype, frame.shape, compress) == encode_array(frame, compress)
    with pytest.raises(CodecError, match="cannot encode"):
        encode_raw(frames[0][:-1], frames[0].dtype, frames[0].shape)
