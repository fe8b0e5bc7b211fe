"""The tree toolkit: walking observation trees (arrays nested in dicts, lists and tuples).

Every function here visits leaves in one order, the order the wire format uses: depth first,
dict values in insertion order (never sorted), list and tuple items by position. Anything that
is not a mapping, list or tuple is a leaf (arrays, tensors, scalars, None). Functions take the
function to apply first, then the trees.

- :func:`tree_leaves`, :func:`tree_leaves_with_paths`: the leaves, optionally with their paths;
- :func:`tree_map`: apply a function leafwise to one tree or several trees of one structure;
- :func:`tree_stack`: combine a list of trees leafwise (``np.stack``, ``np.concatenate``, ...);
- :func:`tree_structure` / :func:`tree_unflatten`: a tree's shape without its leaves, as JSON-able
  data (the ``o`` and ``s`` fields of a chunk template carry it), and back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Tree = Any  # leaf | Mapping[str, Tree] | list[Tree] | tuple[Tree, ...]
Path = tuple[str | int, ...]  # dict keys and list/tuple positions from the root to a leaf
Structure = Any  # leaf ordinal (int) | {"d": {key: Structure}} | {"u": [Structure]} | {"l": [Structure]}


def _rebuild(node: list | tuple, children: list) -> list | tuple:
    """A list or tuple of the type of ``node`` holding ``children`` (NamedTuples keep their type)."""
    kind = type(node)
    if kind is list or kind is tuple:
        return kind(children)
    make = getattr(node, "_make", None)
    return make(children) if make is not None else kind(children)


def _collect(node: Tree, out: list[Any]) -> None:
    # dict, list and tuple first: the common cases cost one isinstance each, the ABC check last
    if isinstance(node, dict):
        for value in node.values():
            _collect(value, out)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _collect(value, out)
    elif isinstance(node, Mapping):
        for value in node.values():
            _collect(value, out)
    else:
        out.append(node)


def tree_leaves(tree: Tree) -> list[Any]:
    """The leaves of ``tree``, depth first, dicts in insertion order."""
    leaves: list[Any] = []
    _collect(tree, leaves)
    return leaves


def tree_leaves_with_paths(tree: Tree) -> list[tuple[Path, Any]]:
    """``(path, leaf)`` pairs in :func:`tree_leaves` order; a path is the tuple of dict keys and
    list/tuple positions leading to its leaf (``()`` when ``tree`` is itself a leaf)."""
    out: list[tuple[Path, Any]] = []

    def walk(node: Tree, path: Path) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(value, (*path, i))
        else:
            out.append((path, node))

    walk(tree, ())
    return out


def _check_same(node: Mapping | Sequence, others: tuple[Tree, ...], path: Path) -> None:
    for other in others:
        if isinstance(node, Mapping):
            same = isinstance(other, Mapping) and len(other) == len(node) and all(k in other for k in node)
        else:
            same = isinstance(other, (list, tuple)) and len(other) == len(node)
        if not same:
            shape = sorted(map(str, node)) if isinstance(node, Mapping) else f"{len(node)} items"
            raise ValueError(f"tree_map: trees differ at {path}: {type(other).__name__} {other!r:.80} "
                             f"where the first tree has a {type(node).__name__} of {shape}")


def _map1(fn: Callable[[Any], Any], node: Tree) -> Tree:
    if isinstance(node, dict):
        return {k: _map1(fn, v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return _rebuild(node, [_map1(fn, v) for v in node])
    if isinstance(node, Mapping):
        return {k: _map1(fn, v) for k, v in node.items()}
    return fn(node)


def _map_n(fn: Callable[..., Any], node: Tree, others: tuple[Tree, ...], path: Path) -> Tree:
    if isinstance(node, Mapping):
        _check_same(node, others, path)
        return {k: _map_n(fn, v, tuple(o[k] for o in others), (*path, k)) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        _check_same(node, others, path)
        return _rebuild(node, [_map_n(fn, v, tuple(o[i] for o in others), (*path, i)) for i, v in enumerate(node)])
    return fn(node, *others)


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """``tree`` with each leaf ``x`` replaced by ``fn(x, *(the same leaf of each of rest))``.

    The trees of ``rest`` must have the structure of ``tree`` (the same dict keys, in any order;
    the same list/tuple lengths); ValueError naming the path where one does not. The result has
    the containers of ``tree``: dicts (for any mapping), lists, tuples, NamedTuples.
    """
    return _map_n(fn, tree, rest, ()) if rest else _map1(fn, tree)


def tree_stack(fn: Callable[[list[Any]], Any], trees: Sequence[Tree]) -> Tree:
    """Combine same-structured ``trees`` leafwise: ``fn`` gets the list of one leaf of each tree
    (e.g. ``np.stack``); the result has the structure of ``trees[0]``."""
    if not trees:
        raise ValueError("tree_stack needs at least one tree")
    return tree_map(lambda *leaves: fn(list(leaves)), *trees)


def tree_structure(tree: Tree) -> Structure:
    """The JSON-able structure of ``tree``: each leaf becomes its ordinal in :func:`tree_leaves`
    order, a dict ``{"d": {key: ...}}`` (keys in insertion order), a tuple ``{"u": [...]}`` and a
    list ``{"l": [...]}``. Chunk templates carry it, so this format is part of the wire format.

    Two trees have equal structures (``==``) exactly when they have the same containers and
    leaf paths, in the same leaf order (a leaf's ordinal is part of its structure, so dicts with
    the same keys in another order differ). ValueError when a dict key is not a string.
    """
    count = 0

    def walk(node: Tree) -> Structure:
        nonlocal count
        if isinstance(node, Mapping):
            bad = [k for k in node if not isinstance(k, str)]
            if bad:
                raise ValueError(f"tree dict keys must be strings, got {bad[0]!r}")
            return {"d": {k: walk(v) for k, v in node.items()}}
        if isinstance(node, tuple):
            return {"u": [walk(v) for v in node]}
        if isinstance(node, list):
            return {"l": [walk(v) for v in node]}
        count += 1
        return count - 1

    return walk(tree)


def tree_unflatten(structure: Structure, leaves: Sequence[Any]) -> Tree:
    """Inverse of :func:`tree_leaves` given :func:`tree_structure`: the tree of that structure
    holding ``leaves`` (plain dicts, lists and tuples). ``structure`` must be well formed (as
    :func:`tree_structure` makes it; validate untrusted ones first); ValueError when it refers
    to a leaf beyond ``leaves``."""
    def build(node: Structure) -> Tree:
        if isinstance(node, int):
            if node >= len(leaves):
                raise ValueError(f"tree structure refers to leaf {node}, only {len(leaves)} given")
            return leaves[node]
        (kind, value), = node.items()
        if kind == "d":
            return {k: build(v) for k, v in value.items()}
        children = [build(v) for v in value]
        return tuple(children) if kind == "u" else children

    return build(structure)
