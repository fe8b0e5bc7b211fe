import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from surreal_redis.codec import (
    CodecError,
    decode_array,
    decode_tree,
    digest,
    encode_array,
    encode_tree,
)

ALLOWED = st.sampled_from(["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"])
arrays = ALLOWED.flatmap(lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, max_side=6)))


def assert_tree_equal(a, b):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_tree_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_tree_equal(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


@given(arrays, st.sampled_from([None, 0, 64]))
def test_array_round_trip(arr, compress):
    out = decode_array(encode_array(arr, compress))
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable


trees = st.recursive(
    arrays | st.integers(-10, 10) | st.booleans() | st.none() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4), children, max_size=3)
    | st.lists(children, max_size=3).map(tuple),
    max_leaves=8,
)


@given(trees, st.sampled_from([None, 16]))
def test_tree_round_trip(tree, compress):
    assert_tree_equal(tree if not isinstance(tree, np.generic) else np.asarray(tree), decode_tree(encode_tree(tree, compress)))


def test_lz4_shrinks_compressible_frames():
    frame = np.zeros((84, 84), np.uint8)
    frame[20:40, 10:70] = 200
    blob = encode_array(frame, compress_min_bytes=1024)
    assert len(blob) < frame.nbytes / 4
    np.testing.assert_array_equal(decode_array(blob), frame)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_hostile_bytes_raise_codec_error(data):
    for decode in (decode_array, decode_tree):
        try:
            decode(data)
        except CodecError:
            pass


@settings(max_examples=200)
@given(trees, st.data())
def test_mutated_tree_never_crashes_otherwise(tree, data):
    blob = bytearray(encode_tree(tree, 8))
    if not blob:
        return
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] = data.draw(st.integers(0, 255))
    try:
        decode_tree(bytes(blob))
    except CodecError:
        pass


def test_declared_size_must_match():
    blob = bytearray(encode_array(np.arange(10, dtype=np.int64)))
    with pytest.raises(CodecError, match="bytes"):
        decode_array(bytes(blob[:-1]))
    with pytest.raises(CodecError):
        decode_array(b"SRA1" + bytes([1, 7, 1]) + (2**31 - 1).to_bytes(4, "little") + b"\x00" * 8)


def test_disallowed_dtype_and_objects_rejected():
    with pytest.raises(CodecError, match="not allowed"):
        encode_array(np.array(["a"], dtype=object))
    with pytest.raises(CodecError, match="cannot encode"):
        encode_tree({"x": object()})
    header = b'{"t":{"a":0},"l":[["object",[1],8,"raw"]]}'
    with pytest.raises(CodecError, match="not allowed"):
        decode_tree(b"SRT1" + len(header).to_bytes(4, "little") + header + b"\x00" * 8)


def test_digest_is_stable_and_short():
    assert digest(b"abc") == digest(bytearray(b"abc"))
    assert len(digest(b"abc")) == 32 and digest(b"abc") != digest(b"abd")


def test_decode_without_copy_gives_read_only_views():
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "c": np.zeros(4096, np.uint8)}
    blob = encode_tree(tree, compress_min_bytes=1024)
    views = decode_tree(blob, copy=False)
    np.testing.assert_array_equal(views["w"], tree["w"])
    assert not views["w"].flags.writeable and not views["c"].flags.writeable
    assert decode_tree(blob)["w"].flags.writeable
