"""package.yaml read with its line numbers kept, so every error can point at a line.

PyYAML silently keeps the last of two equal keys; a second ``target:`` under ``components``
would drop a component without a word, so duplicate keys are refused here. Hostile files are
refused in bounded time: aliases share nodes, so a 1 KB file of nested aliases can stand for
billions of values; its expanded size and depth are measured once per node (not once per
reference) and refused past ``MAX_VALUES`` / ``MAX_DEPTH``, before anything walks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engines.errors import PackageError
from engines.package.schema import field_path

MAX_DEPTH = 64  # a package.yaml nests a handful of levels
MAX_VALUES = 100_000  # scalars, lists and mappings, aliases counted as what they expand to


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


# libyaml's safe loader where PyYAML was built with it (the same documents, an order of
# magnitude faster: a converted package's prompts are thousands of nodes), else PyYAML's own;
# a document libyaml refuses is parsed again by PyYAML's, whose messages the errors quote
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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
        try:
            root = yaml.compose(text, Loader=LOADER)
        except yaml.MarkedYAMLError:  # PyYAML's own parser says what is wrong in its words
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _refuse_oversized(path, root)
        data = yaml.load(text, Loader=LOADER)
    except RecursionError:
        raise PackageError(f"{path.name} nests too deeply to be a package description",
                           field="<document>", remedy=f"a package.yaml nests at most "
                           f"{MAX_DEPTH} levels; rewrite the file", where=str(path)) from None
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
        _refuse_duplicate_keys(source, root)
    return source


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _refuse_oversized(path: Path, root: yaml.Node) -> None:
    """Expanded size and depth of the node graph, each node measured once (iteratively, so
    neither a deep file nor an alias bomb costs more than one pass over its distinct nodes)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            on_path.discard(key)
            line = node.start_mark.line + 1
            if depth[key] > MAX_DEPTH:
                raise PackageError(f"{path.name} nests deeper than {MAX_DEPTH} levels",
                                   field="<document>", value=depth[key],
                                   remedy=f"a package.yaml nests at most {MAX_DEPTH} levels",
                                   where=f"{path}:{line}")
            if size[key] > MAX_VALUES:
                raise PackageError(f"{path.name} expands to more than {MAX_VALUES:,} values "
                                   f"(YAML aliases repeat what they name)",
                                   field="<document>", value=size[key],
                                   remedy="write the values out, without nested aliases",
                                   where=f"{path}:{line}")
            continue
        if key in size:
            continue
        if key in on_path:
            raise PackageError(f"{path.name} holds a recursive alias (a value that contains "
                               f"itself)", field="<document>",
                               remedy="remove the alias that refers to its own anchor",
                               where=f"{path}:{node.start_mark.line + 1}")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)


def _refuse_duplicate_keys(source: YamlSource, root: yaml.Node) -> None:
    """Each distinct mapping checked once (aliases share nodes); iterative."""
    checked: set[int] = set()
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if id(node) in checked:
            continue
        checked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        field = field_path((*loc, key.value))
                        raise PackageError(
                            f"key {key.value!r} appears twice in the same mapping (lines "
                            f"{seen[key.value]} and {line}); YAML would silently keep only "
                            f"the last", field=field, value=key.value,
                            remedy="remove or rename one of them",
                            where=f"{source.path}:{line}")
                    seen[key.value] = line
                    stack.append((value, (*loc, key.value)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
