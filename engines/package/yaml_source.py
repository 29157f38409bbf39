"""package.yaml read with its line numbers kept, so every error can point at a line.

PyYAML silently keeps the last of two equal keys; a second ``target:`` under ``components``
would drop a component without a word, so duplicate keys are refused here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engines.errors import PackageError
from engines.package.schema import field_path


@dataclass(frozen=True)
class YamlSource:
    path: Path
    data: Any
    root: yaml.Node | None

    def line_of(self, loc: tuple) -> int | None:
        """1-based line of the deepest node along ``loc`` (a pydantic-style location)."""
        node, line = self.root, None
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            if isinstance(node, yaml.MappingNode):
                nxt = None
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                        nxt = key if part == "[key]" else value
                        line = key.start_mark.line + 1
                        break
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                node = node.value[part] if 0 <= part < len(node.value) else None
            elif part == "[key]":
                break
            else:
                node = None
        if node is not None:
            line = node.start_mark.line + 1
        return line

    def where(self, loc: tuple = ()) -> str:
        line = self.line_of(loc) if loc else None
        return f"{self.path}:{line}" if line else str(self.path)


def read_yaml(path: Path) -> YamlSource:
    """Parse ``path``; syntax errors and duplicate keys become ``PackageError`` with a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PackageError(f"{path.name} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           remedy="save package.yaml as UTF-8", where=str(path)) from None
    except OSError as exc:
        raise PackageError(f"cannot read {path.name}: {exc.strerror}",
                           remedy="check the file's permissions", where=str(path)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        lines = text.splitlines()

        def at(mark) -> str:
            return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""

        # the problem mark may sit past the last line (an unclosed bracket); the context
        # mark then shows where the unfinished construct began
        mark = next((m for m in (exc.problem_mark, exc.context_mark)
                     if m is not None and m.line < len(lines)), None)
        context = f"{exc.context}{at(exc.context_mark)}: " if exc.context else ""
        line = mark.line + 1 if mark else None
        raise PackageError(
            f"{path.name} is not valid YAML: {context}{exc.problem}{at(exc.problem_mark)}",
            value=lines[mark.line].strip() if mark else None,
            remedy=f"fix the YAML syntax{at(mark)} (indentation, ':' after keys, matching "
                   f"brackets and quotes)",
            where=f"{path}:{line}" if line else str(path)) from None
    except yaml.YAMLError as exc:
        raise PackageError(f"{path.name} is not valid YAML: {exc}",
                           remedy="fix the YAML syntax", where=str(path)) from None
    source = YamlSource(path, data, root)
    if root is not None:
        _refuse_duplicate_keys(source, root, ())
    return source


def _refuse_duplicate_keys(source: YamlSource, node: yaml.Node, loc: tuple) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    field = field_path((*loc, key.value))
                    raise PackageError(
                        f"key {key.value!r} appears twice in the same mapping (lines "
                        f"{seen[key.value]} and {line}); YAML would silently keep only the "
                        f"last", field=field, value=key.value,
                        remedy="remove or rename one of them", where=f"{source.path}:{line}")
                seen[key.value] = line
                _refuse_duplicate_keys(source, value, (*loc, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(source, item, (*loc, i))
