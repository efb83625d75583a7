"""Reading a DistributedTrainingJob's spec: SpecError, and the one Reader every section is parsed with.

Each error names the field it is about (`spec.workers`, `spec.dataset.stageFrom.container`), so the job's
Failed condition says exactly which field is wrong. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dtjob.spec import validators as rules

Json = dict[str, Any]


class SpecError(ValueError):
    """A spec value the operator cannot run; `path` names the field (e.g. `spec.workers`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class Reader:
    """Typed access to one object of the spec, remembering its path for error messages."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SpecError(path, f"must be an object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def child(self, key: str) -> Reader:
        return Reader(self.data.get(key), self.at(key))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise SpecError(self.at(key), f"must be a string, got {value!r}")
        return value

    def required_string(self, key: str) -> str:
        value = self.string(key)
        if not value:
            raise SpecError(self.at(key), "is required")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(key)
        if value is None:
            return default
        if value not in choices:
            raise SpecError(self.at(key), f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def integer(
        self, key: str, default: int | None, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(self.at(key), f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise SpecError(self.at(key), f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise SpecError(self.at(key), f"must be <= {maximum}, got {value}")
        return value

    def bounded(self, key: str, default: int, low: int, high: int) -> int:
        """An integer from `low` to `high`, `default` when absent."""
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(self.at(key), f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise SpecError(self.at(key), f"must be between {low} and {high}, got {value}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0, below: float | None = None) -> float:
        """A number >= minimum and, with `below`, strictly less than it."""
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(self.at(key), f"must be a number, got {value!r}")
        if value < minimum:
            raise SpecError(self.at(key), f"must be >= {minimum}, got {value}")
        if below is not None and value >= below:
            raise SpecError(self.at(key), f"must be < {below}, got {value}")
        return float(value)

    def checked(self, key: str, problem: Callable[[str], str | None]) -> str | None:
        """An optional string that `problem` (from dtjob.spec.validators) finds nothing wrong with."""
        value = self.string(key)
        if value is not None and (found := problem(value)) is not None:
            raise SpecError(self.at(key), found)
        return value

    def labels(self, key: str, values_are_labels: bool = True) -> dict[str, str]:
        """A map of label (or, with values_are_labels False, annotation) keys to values."""
        found = self.string_map(key)
        if len(found) > rules.MAX_MAP_ENTRIES:
            raise SpecError(self.at(key), f"must have at most {rules.MAX_MAP_ENTRIES} entries")
        for k, value in found.items():
            problem = rules.label_key_problem(k)
            if problem is None and values_are_labels:
                problem = rules.label_value_problem(value)
            if problem is not None:
                raise SpecError(f"{self.at(key)}[{k}]", problem)
        return found

    def tolerations(self, key: str) -> tuple[Json, ...]:
        found = self.object_list(key)
        if len(found) > rules.MAX_TOLERATIONS:
            raise SpecError(self.at(key), f"must have at most {rules.MAX_TOLERATIONS} items")
        for i, toleration in enumerate(found):
            problem = rules.toleration_problem(toleration)
            if problem is not None:
                raise SpecError(f"{self.at(key)}[{i}].{problem[0]}", problem[1])
        return found

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"must be true or false, got {value!r}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.data.get(key) or {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SpecError(self.at(key), "must map strings to strings")
        return dict(value)

    def string_list(self, key: str) -> tuple[str, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SpecError(self.at(key), "must be a list of strings")
        return tuple(value)

    def object_list(self, key: str) -> tuple[Json, ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise SpecError(self.at(key), "must be a list of objects")
        return tuple(dict(v) for v in value)

    def optional_object(self, key: str) -> Json | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise SpecError(self.at(key), "must be an object")
        return dict(value)
