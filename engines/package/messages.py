"""pydantic validation errors rewritten as ``PackageError``: file and line, field path, value,
and what would be valid.

pydantic's own text ("Input should be a valid integer") names neither the file nor the
remedy; a package author needs both. Each error type pydantic can raise on the schema gets
one sentence here; an unforeseen type still comes out in the same form, with pydantic's
sentence as the message.
"""
from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from engines.errors import PackageError
from engines.package.schema import (FORMAT_VERSION, INPUT_ROLES, NAME_PATTERN, OUTPUT_ROLES,
                                    PACKAGE_NAME_PATTERN, PackageSpec, field_path)
from engines.package.yaml_source import YamlSource

_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "string_type": "a string", "bool_type": "true or false", "float_type": "a number",
    "dict_type": "a mapping (key: value lines)", "model_type": "a mapping (key: value lines)",
    "list_type": "a list", "none_required": "null",
}


def yaml_kind(value: Any) -> str:
    """How a YAML author would name the type of a parsed value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def did_you_mean(word: Any, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model that validates the value at ``loc`` (None if not a model)."""
    tp: Any = PackageSpec
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _describe(err: dict) -> tuple[tuple, str, Any, str]:
    """(loc, message, value, remedy) for one pydantic error dict."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "lockstep":
        return loc + tuple(ctx["loc"]), ctx["message"], ctx["value"], ctx["remedy"]
    if loc and loc[-1] == "[key]":
        return _describe_key(loc[:-1], kind, value)
    name = loc[-1] if loc and isinstance(loc[-1], str) else (field_path(loc) or "package")
    where = field_path(loc[:-1]) or "the top level"

    if loc == ("format",):
        return (loc, f"unsupported package format {value!r}; this lockstep reads format "
                     f"{FORMAT_VERSION}", value, f"write format: {FORMAT_VERSION}, or use the "
                                                 f"lockstep release that wrote this package")
    if loc == ("decoding", "speculative") and kind == "none_required":
        return (loc, "the speculative section is reserved and not defined in format 1",
                value, "set speculative: null, or remove it")
    if kind == "missing":
        model = _model_at(loc[:-1])
        field = model.model_fields.get(name) if model else None
        hint = f" ({field.description})" if field and field.description else ""
        return loc, f"required field {name!r} is missing {'in' if loc[:-1] else 'at'} {where}", None, \
            f"add {name}:{hint}"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = list(model.model_fields) if model else []
        if model is not None and not allowed:
            return (loc, f"unknown field {name!r} in {where}, which takes no fields in "
                         f"format 1", value, f"remove {name} (write {loc[-2]}: {{}})")
        return (loc, f"unknown field {name!r} in {where}{did_you_mean(name, allowed)}", value,
                f"remove it or fix its spelling; the fields allowed here are: "
                f"{', '.join(allowed)}")
    if kind == "literal_error":
        return (loc, f"{name} {value!r} is not one of the allowed values", value,
                f"use one of: {ctx.get('expected', '')}")
    if kind in _EXPECTED:
        remedy = f"write {name} as {_EXPECTED[kind]}"
        if isinstance(value, str) and kind.startswith("int") and value.strip().lstrip("-").isdigit():
            remedy += " (without quotes)"
        if loc[:1] == ("prompts",) and len(loc) == 2 and kind == "list_type":
            remedy = "prompts is a list of prompts, each a list of token ids: prompts: [[1, 17, 42]]"
        model = _model_at(loc[:-1])
        field = model.model_fields.get(name) if model and isinstance(name, str) else None
        if field is not None and field.description and kind != "int_type":
            remedy += f": {field.description}"
        return loc, f"{name} must be {_EXPECTED[kind]}, not {yaml_kind(value)}", value, remedy
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}
    if kind in bounds:
        limit = next(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le"))
        return (loc, f"{name} is {value!r}, but must be {bounds[kind]} {limit}", value,
                f"use a value {bounds[kind]} {limit}")
    if kind == "too_short":
        need = ctx.get("min_length", 1)
        return (loc, f"{name} needs at least {need} item{'s' if need != 1 else ''}, "
                     f"it has {ctx.get('actual_length', 0)}", value,
                _remedy_for_empty(loc))
    if kind == "string_too_short":
        return loc, f"{name} must not be an empty string", value, f"give {name} a value"
    if kind == "string_pattern_mismatch":
        chars = "letters, digits, '_', '-' and '.'" if ctx.get("pattern") == \
            PACKAGE_NAME_PATTERN else "letters, digits, '_' and '-'"
        return (loc, f"{name} {value!r} contains characters a name may not hold", value,
                f"use only {chars}, starting with a letter, digit or '_'")
    return loc, f"{name}: {err['msg']}", value, "see the package format in docs/ARCHITECTURE.md"


def _describe_key(loc: tuple, kind: str, key: Any) -> tuple[tuple, str, Any, str]:
    """Errors on a mapping key (``loc`` ends with the key): unknown roles, malformed names."""
    full, parent = loc, loc[-2:-1]
    if parent == ("inputs",) and kind == "literal_error":
        return (full, f"unknown input role {key!r}{did_you_mean(key, INPUT_ROLES)}", key,
                f"use one of the input roles: {', '.join(INPUT_ROLES)}")
    if parent == ("outputs",) and kind == "literal_error":
        return (full, f"unknown output role {key!r}{did_you_mean(key, OUTPUT_ROLES)}", key,
                f"use one of the output roles: {', '.join(OUTPUT_ROLES)}")
    what = {("components",): "component", ("state",): "state cell"}.get(parent, "key")
    if kind == "string_pattern_mismatch":
        return (full, f"{what} name {key!r} contains characters a name may not hold", key,
                f"rename it using only letters, digits, '_' and '-' (pattern {NAME_PATTERN})")
    if kind in _EXPECTED:
        return (full, f"{what} name must be a string, not {yaml_kind(key)}", key,
                f"quote it or rename it")
    return full, f"{what} name {key!r}: {kind}", key, "rename it"


def _remedy_for_empty(loc: tuple) -> str:
    if loc == ("prompts",):
        return "add at least one prompt, e.g. prompts: [[1, 17, 42]]"
    if loc and loc[0] == "prompts":
        return "give the prompt at least one token id"
    if loc == ("components",):
        return "declare at least one component (path, inputs, outputs)"
    if loc[-1:] == ("inputs",):
        return f"bind at least one input role ({', '.join(INPUT_ROLES)})"
    if loc[-1:] == ("outputs",):
        return f"bind at least one output role ({', '.join(OUTPUT_ROLES)})"
    return "give it at least one item"


def package_error_from(exc: ValidationError, source: YamlSource) -> PackageError:
    """The first problem in full; the rest named by field so none is lost."""
    described = [_describe(e) for e in exc.errors()]
    loc, message, value, remedy = described[0]
    if len(described) > 1:
        others = ", ".join(field_path(d[0]) or "(top level)" for d in described[1:])
        message += (f" (1 of {len(described)} problems in {source.path.name}; the others are "
                    f"at: {others})")
    return PackageError(message, field=field_path(loc) or None, value=value, remedy=remedy,
                        where=source.where(loc))
