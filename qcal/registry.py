"""A small typed name -> object registry (quantizers, selectors, architectures)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from qcal.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; an unknown name's error lists the known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None) -> Callable[[T], T] | T:
        """Register `item` under `name`; usable as a decorator when `item` is omitted."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ConfigError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add if item is None else add(item)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
