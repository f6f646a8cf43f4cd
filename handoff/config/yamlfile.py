"""YAML loading that remembers line numbers, so validation errors can say `file:line`.

Mappings load as `LineDict` (a dict with `.line` and `.key_lines`); duplicate keys
are an error instead of PyYAML's silent last-one-wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class LineDict(dict[Any, Any]):
    """A mapping from YAML with the line it starts on and the line of each key."""

    line: int = 0
    key_lines: dict[Any, int]


class YamlError(ValueError):
    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    mapping = LineDict()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise YamlError(loader.name, line, f"a key must be a plain value, got {key!r}")
        if key in mapping:
            raise YamlError(loader.name, line, f"duplicate key {key!r}")
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[key] = line
    return mapping


def loader_class(base: type[Any]) -> type[Any]:
    """`base` (yaml.SafeLoader or yaml.CSafeLoader) building LineDicts and refusing
    duplicate keys."""
    cls: type[Any] = type("_Loader", (base,), {})
    cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    return cls


# libyaml's parser when PyYAML was built with it: several times faster than the pure-Python
# one, with the same nodes and marks (line numbers), so errors still name file:line.
_Loader = loader_class(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load(path: Path) -> Any:
    """Parse `path`; any syntax error becomes a YamlError naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlError(path, None, f"cannot read: {exc.strerror or exc}") from None
    loader = _Loader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise YamlError(path, line, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlError(path, None, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def line_of(mapping: Any, key: Any = None) -> int | None:
    if isinstance(mapping, LineDict):
        if key is not None and key in mapping.key_lines:
            return mapping.key_lines[key]
        return mapping.line
    return None
