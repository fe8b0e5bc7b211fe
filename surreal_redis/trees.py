"""The tree toolkit: walking observation trees (arrays nested in dicts, lists and tuples).

Every function here visits leaves in one order, the order the wire format uses: depth first,
dict values in insertion order (never sorted), list and tuple items by position. Anything that
is not a mapping, list or tuple is a leaf (arrays, tensors, scalars, None). Functions take the
function to apply first, then the trees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Tree = Any  # leaf | Mapping[str, Tree] | list[Tree] | tuple[Tree, ...]
Path = tuple[str | int, ...]  # dict keys and list/tuple positions from the root to a leaf
Structure = Any  # leaf ordinal (int) | {"d": {key: Structure}} | {"u": [Structure]} | {"l": [Structure]}


_LEAF, _MAPPING, _SEQUENCE = 1, 2, 3
# type -> kind: one dict lookup instead of up to three isinstance calls (the Mapping one costly)
_KINDS: dict[type, int] = {dict: _MAPPING, list: _SEQUENCE, tuple: _SEQUENCE}


def _classify(node_type: type) -> int:
    if issubclass(node_type, Mapping):
        kind = _MAPPING
    else:
        kind = _SEQUENCE if issubclass(node_type, (list, tuple)) else _LEAF
    _KINDS[node_type] = kind
    return kind


def _rebuild(node: list | tuple, children: list) -> list | tuple:
    """A list or tuple of the type of ``node`` holding ``children`` (NamedTuples keep their type)."""
    kind = type(node)
    if kind is list or kind is tuple:
        return kind(children)
    make = getattr(node, "_make", None)
    return make(children) if make is not None else kind(children)


def _collect(node: Tree, out: list[Any]) -> None:
    kind = _KINDS.get(type(node)) or _classify(type(node))
    if kind == _LEAF:
        out.append(node)
    elif kind == _MAPPING:
        for value in node.values():
            _collect(value, out)
    else:
        for value in node:
            _collect(value, out)


def tree_leaves(tree: Tree) -> list[Any]:
    """The leaves of ``tree``, depth first, dicts in insertion order."""
    leaves: list[Any] = []
    _collect(tree, leaves)
    return leaves


def _collect_paths(node: Tree, path: Path, out: list[tuple[Path, Any]]) -> None:
    kind = _KINDS.get(type(node)) or _classify(type(node))
    if kind == _LEAF:
        out.append((path, node))
    elif kind == _MAPPING:
        for key, value in node.items():
            _collect_paths(value, path + (key,), out)
    else:
        for i, value in enumerate(node):
            _collect_paths(value, path + (i,), out)


def tree_leaves_with_paths(tree: Tree) -> list[tuple[Path, Any]]:
    """``(path, leaf)`` pairs in :func:`tree_leaves` order; a path is the tuple of dict keys and
    list/tuple positions leading to its leaf (``()`` when ``tree`` is itself a leaf)."""
    out: list[tuple[Path, Any]] = []
    _collect_paths(tree, (), out)
    return out


def _check_same(node: Mapping | Sequence, kind: int, others: tuple[Tree, ...], path: Path) -> None:
    for other in others:
        other_kind = _KINDS.get(type(other)) or _classify(type(other))
        same = other_kind == kind and len(other) == len(node)
        if same and kind == _MAPPING:
            same = all(key in other for key in node)
        if not same:
            holds = f"keys {sorted(map(str, node))}" if kind == _MAPPING else f"{len(node)} items"
            raise ValueError(f"tree_map: trees differ at {path}: {type(other).__name__} {other!r:.80} "
                             f"where the first tree has a {type(node).__name__} of {holds}")


def _map1(fn: Callable[[Any], Any], node: Tree) -> Tree:
    kind = _KINDS.get(type(node)) or _classify(type(node))
    if kind == _LEAF:
        return fn(node)
    if kind == _MAPPING:
        return {key: _map1(fn, value) for key, value in node.items()}
    return _rebuild(node, [_map1(fn, value) for value in node])


def _map_n(fn: Callable[..., Any], node: Tree, others: tuple[Tree, ...], path: Path) -> Tree:
    kind = _KINDS.get(type(node)) or _classify(type(node))
    if kind == _LEAF:
        return fn(node, *others)
    _check_same(node, kind, others, path)
    if kind == _MAPPING:
        return {key: _map_n(fn, value, tuple(other[key] for other in others), path + (key,))
                for key, value in node.items()}
    return _rebuild(node, [_map_n(fn, value, tuple(other[i] for other in others), path + (i,))
                           for i, value in enumerate(node)])


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """``tree`` with each leaf ``x`` replaced by ``fn(x, *(the same leaf of each of rest))``.

    The trees of ``rest`` must have the structure of ``tree`` (the same dict keys, in any order;
    the same list/tuple lengths; a tuple may stand for a list); ValueError naming the path where
    one does not. The result has the containers of ``tree``: dicts (for any mapping), lists,
    tuples, NamedTuples.
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
        kind = _KINDS.get(type(node)) or _classify(type(node))
        if kind == _LEAF:
            count += 1
            return count - 1
        if kind == _MAPPING:
            bad = [key for key in node if not isinstance(key, str)]
            if bad:
                raise ValueError(f"tree dict keys must be strings, got {bad[0]!r}")
            return {"d": {key: walk(value) for key, value in node.items()}}
        return {"u" if isinstance(node, tuple) else "l": [walk(value) for value in node]}

    return walk(tree)


def _build(node: Structure, leaves: Sequence[Any]) -> Tree:
    if type(node) is int:
        return leaves[node]
    (kind, value), = node.items()
    if kind == "d":
        return {key: _build(child, leaves) for key, child in value.items()}
    children = [_build(child, leaves) for child in value]
    return tuple(children) if kind == "u" else children


def tree_unflatten(structure: Structure, leaves: Sequence[Any]) -> Tree:
    """Inverse of :func:`tree_leaves` given :func:`tree_structure`: the tree of that structure
    holding ``leaves`` (plain dicts, lists and tuples). ``structure`` must be well formed (as
    :func:`tree_structure` makes it; validate untrusted ones first); ValueError when it refers
    to a leaf beyond ``leaves``."""
    try:
        return _build(structure, leaves)
    except IndexError:
        raise ValueError(f"tree structure {structure!r:.200} refers to more than the {len(leaves)} "
                         "leaves given") from None
