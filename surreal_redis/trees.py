"""Mapping functions over observation trees (arrays or tensors nested in dicts, lists, tuples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from surreal_redis.codec import Tree


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """Apply ``fn`` leafwise to ``tree`` and the same-structured trees ``rest``."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v, *(r[i] for r in rest)) for i, v in enumerate(tree))
    return fn(tree, *rest)


def tree_stack(trees: list[Tree], fn: Callable[[list[Any]], Any]) -> Tree:
    """Combine same-structured ``trees`` leafwise with ``fn`` (e.g. ``np.stack``) on the leaf lists."""
    return tree_map(lambda *leaves: fn(list(leaves)), *trees)
