"""The tree toolkit: leaf order (the wire's), maps, stacking, paths, structures."""

import json
import struct
from collections import OrderedDict
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from surreal_redis.chunks import Chunk
from surreal_redis.codec import encode_tree
from surreal_redis.hub.experience import payload as pl
from surreal_redis.replay.nstep import NStepBuilder
from surreal_redis.replay.uniform import UniformReplay, UniformReplayConfig
from surreal_redis.trees import (
    tree_leaves,
    tree_leaves_with_paths,
    tree_map,
    tree_stack,
    tree_structure,
    tree_unflatten,
)

# Leaves are distinct ints so an order mix-up shows; containers as observations use them.
_counter = iter(range(1 << 30))
leaves = st.builds(lambda: next(_counter))
trees = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=3)
    | st.lists(children, max_size=3).map(tuple)
    | st.dictionaries(st.text("abc/", max_size=3), children, max_size=3),
    max_leaves=10,
)


def _nested() -> dict:
    # insertion order b, a: the wire keeps it (never sorted)
    return {"b": (np.zeros(3, np.float32), [np.ones((2, 2), np.uint8), np.full(1, 7)]), "a": np.arange(4.0)}


def test_leaves_depth_first_in_insertion_order_not_sorted():
    tree = _nested()
    out = tree_leaves(tree)
    assert [x.shape for x in out] == [(3,), (2, 2), (1,), (4,)]
    assert out[0] is tree["b"][0] and out[3] is tree["a"]  # the leaves themselves, not copies
    assert tree_leaves({"z": 1, "a": 2, "m": {"y": 3, "b": 4}}) == [1, 2, 3, 4]


def test_leaves_of_a_leaf_and_of_empty_containers():
    arr = np.zeros((2, 3))
    assert tree_leaves(arr)[0] is arr and len(tree_leaves(arr)) == 1  # arrays are never iterated
    assert tree_leaves(None) == [None]
    assert tree_leaves({}) == [] and tree_leaves([]) == [] and tree_leaves(((), {"a": []})) == []
    assert tree_leaves(np.float32(1.5)) == [np.float32(1.5)]
    assert tree_leaves({"s": "abc", "b": b"xy"}) == ["abc", b"xy"]  # sequences, but not containers here


def test_leaves_follow_the_order_of_the_parameter_wire():
    tree = {"z": np.zeros(3, np.int16), "y": (np.ones(2, np.float32), [np.zeros((1, 2), np.uint8)]),
            "x": {"q": np.zeros((5,))}}
    blob = encode_tree(tree)
    (header_len,) = struct.unpack_from("<I", blob, 4)
    specs = json.loads(blob[8:8 + header_len])["l"]
    assert [tuple(spec[1]) for spec in specs] == [x.shape for x in tree_leaves(tree)]


def test_structure_is_the_chunk_template_format():
    # These bytes are what chunk templates carried before the toolkit: they must not change.
    obs = _nested()
    assert json.dumps(tree_structure(obs), separators=(",", ":")) == '{"d":{"b":{"u":[0,{"l":[1,2]}]},"a":3}}'
    specs = [pl.Leaf(np.dtype("<f4"), (3,), False), pl.Leaf(np.dtype("u1"), (2, 2), True),
             pl.Leaf(np.dtype("<i8"), (1,), False), pl.Leaf(np.dtype("<f8"), (4,), False)]
    state = ({"h": np.zeros(5, np.float32)}, [np.zeros((), np.int32)])
    layout = pl.Layout.create(obs, specs, (np.dtype("<i8"), ()), [("logp", np.dtype("<f4"), ())], state)
    assert layout.template == (
        b'{"o":{"d":{"b":{"u":[0,{"l":[1,2]}]},"a":3}},"l":[["float32",[3],0],["uint8",[2,2],1],'
        b'["int64",[1],0],["float64",[4],0]],"a":["int64",[]],"x":[["logp","float32",[]]],'
        b'"s":{"u":[{"d":{"h":0}},{"l":[1]}]},"sl":[["float32",[5]],["int32",[]]]}')
    rebuilt = pl.Layout.parse(layout.template).build_obs(tree_leaves(obs))
    assert tree_structure(rebuilt) == tree_structure(obs)


@given(trees)
def test_unflatten_inverts_leaves(tree):
    structure = tree_structure(tree)
    assert json.loads(json.dumps(structure)) == structure  # JSON-able as it is
    rebuilt = tree_unflatten(structure, tree_leaves(tree))
    assert rebuilt == tree and tree_structure(rebuilt) == structure
    assert repr(rebuilt) == repr(tree)  # same containers (list vs tuple) and key order


@given(trees)
def test_paths_lead_to_their_leaves(tree):
    pairs = tree_leaves_with_paths(tree)
    assert [leaf for _, leaf in pairs] == tree_leaves(tree)
    assert len({path for path, _ in pairs}) == len(pairs)  # distinct even for keys holding "/"
    for path, leaf in pairs:
        node = tree
        for key in path:
            node = node[key]
        assert node == leaf


def test_paths_do_not_collide_where_joined_strings_would():
    tree = {"a/b": 1, "a": {"b": 2}, "0": [3], "x": ["4"]}
    assert tree_leaves_with_paths(tree) == [(("a/b",), 1), (("a", "b"), 2), (("0", 0), 3), (("x", 0), "4")]
    assert tree_leaves_with_paths(5) == [((), 5)]


def test_structure_equality_is_order_and_container_sensitive():
    assert tree_structure({"a": 1, "b": 2}) == tree_structure({"a": 9, "b": 8})
    assert tree_structure({"a": 1, "b": 2}) != tree_structure({"b": 2, "a": 1})  # another leaf order
    assert tree_structure((1, 2)) != tree_structure([1, 2])
    assert tree_structure({"a": (1, 2)}) != tree_structure({"a": (1, (2,))})


def test_structure_rejects_keys_that_json_would_turn_into_strings():
    with pytest.raises(ValueError, match="must be strings, got 3"):
        tree_structure({"a": {3: np.zeros(1)}})


def test_unflatten_names_a_missing_leaf():
    with pytest.raises(ValueError, match="refers to more than the 2 leaves given"):
        tree_unflatten({"l": [0, 1, 2]}, ["x", "y"])


class Pair(NamedTuple):
    left: object
    right: object


def test_map_keeps_containers_and_key_order():
    tree = {"z": [1, (2, 3)], "a": Pair(4, {"k": 5})}
    out = tree_map(lambda x: x * 10, tree)
    assert out == {"z": [10, (20, 30)], "a": Pair(40, {"k": 50})}
    assert list(out) == ["z", "a"] and type(out["z"]) is list and type(out["z"][1]) is tuple
    assert type(out["a"]) is Pair
    assert tree_map(lambda x: x + 1, 1) == 2


def test_map_takes_any_mapping_and_returns_dicts():
    proxy = MappingProxyType({"b": 1, "a": OrderedDict(c=2)})
    assert tree_leaves(proxy) == [1, 2]
    assert tree_map(str, proxy) == {"b": "1", "a": {"c": "2"}}
    assert tree_structure(proxy) == tree_structure({"b": 0, "a": {"c": 0}})


def test_map_over_several_trees_pairs_leaves_by_key_not_position():
    a = {"x": np.array([1, 2]), "y": (np.array([3]), np.array([4]))}
    b = {"y": (np.array([30]), np.array([40])), "x": np.array([10, 20])}
    out = tree_map(lambda p, q, r: p + q + r, a, b, a)
    assert list(out) == ["x", "y"]
    np.testing.assert_array_equal(out["x"], [12, 24])
    np.testing.assert_array_equal(out["y"][1], [48])


@pytest.mark.parametrize("other, where", [
    ({"x": 1}, r"\(\)"),  # a key missing
    ({"x": 1, "y": (2, 3), "z": 4}, r"\(\)"),  # a key too many
    ({"x": 1, "w": (2, 3)}, r"\(\)"),  # another key
    ({"x": 1, "y": (2,)}, r"\('y',\)"),  # a shorter tuple
    ({"x": 1, "y": 2}, r"\('y',\)"),  # a leaf where the first tree has a tuple
    ({"x": {"deep": 1}, "y": (2, 3)}, None),  # a subtree where the first has a leaf: goes to fn
])
def test_map_over_several_trees_rejects_other_structures(other, where):
    first = {"x": 1, "y": (2, 3)}
    if where is None:
        assert tree_map(lambda p, q: (p, q), first, other)["x"] == (1, {"deep": 1})
        return
    with pytest.raises(ValueError, match=f"trees differ at {where}"):
        tree_map(lambda p, q: p + q, first, other)


def test_stack_takes_the_function_first():
    trees_ = [{"o": (np.full(2, i), np.full((1, 3), i))} for i in range(4)]
    out = tree_stack(np.stack, trees_)
    assert out["o"][0].shape == (4, 2) and out["o"][1].shape == (4, 1, 3)
    np.testing.assert_array_equal(out["o"][0][:, 0], [0, 1, 2, 3])
    cat = tree_stack(lambda xs: np.concatenate(xs, axis=-1), trees_)
    assert cat["o"][0].shape == (8,) and cat["o"][1].shape == (1, 12)
    with pytest.raises(ValueError, match="at least one tree"):
        tree_stack(np.stack, [])


# ---------------------------------------------------------------- the toolkit's users

def test_uniform_replay_keeps_leaves_apart_whose_joined_paths_collide():
    # With paths joined by "/", the two leaves below had one key and one was silently lost.
    replay = UniformReplay(UniformReplayConfig(capacity=4))
    obs = {"a/b": np.array([[1.0]], np.float32), "a": {"b": np.array([[2.0]], np.float32)}}
    next_obs = {"a": {"b": np.array([[4.0]], np.float32)}, "a/b": np.array([[3.0]], np.float32)}
    replay.insert(obs, np.zeros((1, 1)), np.ones(1, np.float32), next_obs, np.ones(1, np.float32))
    batch = replay.sample(2, np.random.default_rng(0))
    assert list(batch.obs) == ["a/b", "a"]
    np.testing.assert_array_equal(batch.obs["a/b"], [[1.0], [1.0]])
    np.testing.assert_array_equal(batch.obs["a"]["b"], [[2.0], [2.0]])
    np.testing.assert_array_equal(batch.next_obs["a/b"], [[3.0], [3.0]])
    np.testing.assert_array_equal(batch.next_obs["a"]["b"], [[4.0], [4.0]])
    with pytest.raises(ValueError, match="do not match the stored layout"):
        replay.insert({"a/b": obs["a/b"]}, np.zeros((1, 1)), np.ones(1, np.float32), next_obs,
                      np.ones(1, np.float32))


def _chunk(obs: dict, start: float) -> Chunk:
    steps = 2
    return Chunk(agent_id=0, env_index=0, obs=obs, actions=np.zeros((steps, 1), np.float32),
                 rewards=np.full(steps, start, np.float32), terminated=np.zeros(steps, bool),
                 truncated=np.zeros(steps, bool), final_obs={}, policy_version=np.zeros(steps, np.int64),
                 extras={})


def test_nstep_sees_a_reordered_dict_as_the_same_observation():
    builder = NStepBuilder(n=3, gamma=1.0)
    first = {"x": np.arange(3.0)[:, None], "y": np.arange(3)[:, None]}
    assert builder.add(_chunk(first, 1.0)) is None  # both steps wait for a third reward
    # the next chunk starts where the last ended, its dict keys in another order: it continues
    later = {"y": np.arange(2, 5)[:, None], "x": np.arange(2.0, 5.0)[:, None]}
    batch = builder.add(_chunk(later, 2.0))
    np.testing.assert_array_equal(batch.rewards, [1 + 1 + 2, 1 + 2 + 2])  # summed across the two chunks
    # a chunk that does not continue (another value) flushes the waiting steps as truncated
    other = {"x": np.full((3, 1), 9.0), "y": np.full((3, 1), 9)}
    flushed = builder.add(_chunk(other, 0.0))
    np.testing.assert_array_equal(flushed.rewards, [2 + 2, 2])
