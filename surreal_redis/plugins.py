"""Tables of what a config finds by name (algorithms, environment families), each filled from
three places, as Sample Factory's ``register_env`` and gymnasium's registry are:

- the built-ins, loaded the first time the table is read;
- installed packages: entry points of the table's group, read the first time an unknown name is
  looked up (a broken one is logged and skipped, never hiding the built-ins);
- plug-in modules: the config's ``plugins: [my_pkg.mod]`` are imported (:func:`load_plugins`)
  before the config is parsed, by every process of the run, and register at import.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> item, for one kind of item.

    Args:
        kind: what an item is, for messages ("algorithm", "environment family").
        group: the entry-point group installed packages declare items in.
        builtins: returns the built-in ``(name, item)`` pairs (called once, on first use).
        expected: ``(is_item, description)``: an entry point's object must pass ``is_item``.
        describe: a registered item in a refusal (e.g. "by my_pkg.make").
        named: the name an entry point's item goes under (default: the entry point's name).
        check: raises ValueError when a new item clashes with the registered ones otherwise than
            by name (run after the name check).
    """

    def __init__(self, kind: str, group: str, builtins: Callable[[], Iterable[tuple[str, T]]],
                 expected: tuple[Callable[[object], bool], str], describe: Callable[[T], str],
                 named: Callable[[str, T], str] = lambda point, item: point,
                 check: Callable[[T, tuple[T, ...]], None] = lambda item, registered: None) -> None:
        self.kind, self.group = kind, group
        self._builtins, self._expected, self._describe, self._named = builtins, expected, describe, named
        self._check = check
        self._items: dict[str, T] = {}
        self._builtins_read = False
        self._entry_points_read = False

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name``; the same item again is a no-op, another under a taken
        name raises ValueError naming the one registered."""
        self._read_builtins()
        return self._put(name, item)

    def get(self, name: str) -> T | None:
        """The item under ``name`` (entry points read if it is not registered yet), else None."""
        self._read_builtins()
        if name not in self._items:
            self._read_entry_points()
        return self._items.get(name)

    def names(self) -> tuple[str, ...]:
        """Names registered so far, sorted (the built-ins always among them)."""
        self._read_builtins()
        return tuple(sorted(self._items))

    def items(self) -> tuple[T, ...]:
        self._read_builtins()
        return tuple(self._items.values())

    def _put(self, name: str, item: T) -> T:
        held = self._items.get(name)
        if held is not None and held != item:
            raise ValueError(f"{self.kind} {name!r} is registered already ({self._describe(held)})")
        if held is None:
            self._check(item, tuple(self._items.values()))
        self._items[name] = item
        return item

    def _read_builtins(self) -> None:
        if not self._builtins_read:
            self._builtins_read = True
            for name, item in self._builtins():
                self._put(name, item)

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        is_item, description = self._expected
        for point in entry_points(group=self.group):
            try:
                item = point.load()
            except Exception as exc:  # a broken third-party package must not hide the built-ins
                log.error("entry point %s = %s of group %s failed to load: %s", point.name, point.value,
                          self.group, exc)
                continue
            if not is_item(item):
                log.error("entry point %s = %s is a %s, not %s: skipped", point.name, point.value,
                          type(item).__name__, description)
                continue
            self._put(self._named(point.name, item), item)


def load_plugins(modules: Iterable[str]) -> None:
    """Import each plug-in module (which registers its algorithms or environment families); an
    import failure raises ValueError naming the module."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ValueError(f"plugin module {module!r} failed to import: {type(exc).__name__}: {exc}") from exc
