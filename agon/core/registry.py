"""One registry type for every axis looked up by name (loss types, reward modes, loggers).

A registry maps a config value to a function. Registering a name twice is an error, and looking up an unknown
name raises a ``KeyError`` that names the config key and lists the valid names, so a typo in a YAML file reads as
what it is.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    def __init__(self, key: str):
        super().__init__()
        # the config key whose value is looked up here, for error messages
        self.key = key

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(fn: T) -> T:
            if name in self:
                raise ValueError(f"{self.key} {name!r} is already registered")
            self[name] = fn
            return fn

        return wrap

    def get_or_raise(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise KeyError(f"unknown {self.key} {name!r}; registered: {sorted(self)}") from None
