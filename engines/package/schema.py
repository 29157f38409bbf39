"""The package.yaml schema (format 1) as strict pydantic models.

Strict because a package is a contract between people who never meet: a quoted number, a
misspelt key or a token id past the vocabulary must fail when the package is loaded, not
three layers down in an engine. Checks that need the ONNX graphs live in ``ports.py``;
everything here is decidable from the YAML alone.

Cross-field failures are raised as ``PydanticCustomError("lockstep", ...)`` whose context
carries the offending field (relative to the model that raised it), the value and the
remedy, so ``messages.py`` can turn every failure into the same ``PackageError`` form.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

FORMAT_VERSION = 1
PACKAGE_FILE = "package.yaml"

DTYPES = ("float32", "float16", "bfloat16")
INPUT_ROLES = ("tokens", "positions", "embeddings", "carry")
OUTPUT_ROLES = ("logits", "hidden", "carry")
STATE_KINDS = ("kv", "recurrent")
KV_UPDATES = ("append", "static")

Dtype = Literal["float32", "float16", "bfloat16"]
InputRole = Literal["tokens", "positions", "embeddings", "carry"]
OutputRole = Literal["logits", "hidden", "carry"]

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]*$"
PACKAGE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
# component and state-cell names appear in field paths and file names: no dots, no spaces
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
PackageName = Annotated[str, StringConstraints(pattern=PACKAGE_NAME_PATTERN)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def fail(loc: tuple, value: Any, message: str, remedy: str) -> PydanticCustomError:
    """A cross-field failure at ``loc`` (relative to the raising model), for ``messages.py``."""
    return PydanticCustomError("lockstep", "{message}",
                               {"loc": tuple(loc), "value": value, "message": message,
                                "remedy": remedy})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TokenizerSpec(_Strict):
    kind: Literal["huggingface"] = Field(description="tokenizer family; format 1 knows huggingface")
    path: NonEmpty = Field(description="tokenizer.json, relative to the package folder")


class ComponentSpec(_Strict):
    path: NonEmpty = Field(description="the ONNX file, relative to the package folder")
    inputs: dict[InputRole, NonEmpty] = Field(
        min_length=1, description="role -> ONNX graph input name (roles: tokens, positions, "
                                  "embeddings, carry)")
    outputs: dict[OutputRole, NonEmpty] = Field(
        min_length=1, description="role -> ONNX graph output name (roles: logits, hidden, carry)")


class StateCellSpec(_Strict):
    kind: Literal["kv", "recurrent"] = Field(description="kv | recurrent")
    component: Name = Field(description="the component whose graph owns this cell")
    input: NonEmpty = Field(description="graph input fed with the cell's value")
    output: NonEmpty = Field(description="graph output that becomes the cell's new value")
    dtype: Dtype = Field(description="element type of the cell: float32, float16 or bfloat16")
    shape: list[Annotated[int, Field(ge=0)]] = Field(
        min_length=1, description="initial shape; kv: seq extent 0 for append, max_context "
                                  "for static")
    seq_axis: int | None = Field(default=None, description="kv only: the sequence axis")
    update: Literal["append", "static"] | None = Field(
        default=None, description="kv only: append | static")

    @model_validator(mode="after")
    def _kind_rules(self) -> StateCellSpec:
        rank = len(self.shape)
        if self.kind == "recurrent":
            for key in ("seq_axis", "update"):
                if getattr(self, key) is not None:
                    raise fail((key,), getattr(self, key),
                               f"{key} applies to kv cells only, this cell is recurrent",
                               f"remove {key}, or set kind: kv")
            for axis, extent in enumerate(self.shape):
                if extent <= 0:
                    raise fail(("shape",), self.shape,
                               f"a recurrent cell has a fixed shape, but axis {axis} has "
                               f"extent {extent}",
                               "give every axis its real, positive extent")
            return self
        if self.seq_axis is None:
            raise fail(("seq_axis",), None, "a kv cell needs seq_axis (the sequence axis)",
                       f"add seq_axis: an axis in 0..{rank - 1} of shape {self.shape}")
        if self.update is None:
            raise fail(("update",), None, "a kv cell needs update (append or static)",
                       "add update: append (output = input grown by M) or update: static "
                       "(fixed buffer written in-graph)")
        if not 0 <= self.seq_axis < rank:
            raise fail(("seq_axis",), self.seq_axis,
                       f"seq_axis {self.seq_axis} is outside the cell's rank {rank} "
                       f"(shape {self.shape})",
                       f"use an axis in 0..{rank - 1}")
        for axis, extent in enumerate(self.shape):
            if axis != self.seq_axis and extent <= 0:
                raise fail(("shape",), self.shape,
                           f"axis {axis} is not the sequence axis but has extent {extent}",
                           "give every non-sequence axis its real, positive extent")
        if self.update == "append" and self.shape[self.seq_axis] != 0:
            raise fail(("shape",), self.shape,
                       f"an append kv cell starts empty, but its sequence extent (axis "
                       f"{self.seq_axis}) is {self.shape[self.seq_axis]}",
                       f"set shape[{self.seq_axis}] to 0, or use update: static with "
                       f"extent max_context")
        return self


class GreedySpec(_Strict):
    """Greedy decoding takes no parameters in format 1; the mapping must be empty."""


class DecodingSpec(_Strict):
    greedy: GreedySpec = Field(default_factory=GreedySpec,
                               description="greedy decoding contract: {}")
    # Reserved: the speculative issue replaces ``None`` by its own model here.
    speculative: None = Field(default=None, description="reserved; must be null in format 1")


class PackageSpec(_Strict):
    format: Literal[1] = Field(description="package format version: 1")
    name: PackageName = Field(description="package name (letters, digits, '_', '-', '.')")
    description: str = Field(description="one line saying what the package is")
    vocab_size: int = Field(gt=0, description="number of token ids (logits width)")
    bos_id: int | None = Field(default=None, description="beginning-of-sequence id, or null")
    eos_id: int | None = Field(default=None,
                               description="decoding stops after emitting it; or null")
    max_context: int = Field(gt=0, description="most positions a sequence may hold")
    dtype: Dtype = Field(description="compute dtype of the logits: float32, float16 or bfloat16")
    tokenizer: TokenizerSpec | None = Field(
        default=None, description="null or {kind: huggingface, path: tokenizer.json}")
    prompts: list[Annotated[list[int], Field(min_length=1)]] = Field(
        min_length=1, description="default prompts, each a non-empty list of token ids")
    components: dict[Name, ComponentSpec] = Field(
        min_length=1, description="component name -> {path, inputs, outputs}")
    state: dict[Name, StateCellSpec] = Field(
        default_factory=dict, description="state cell name -> {kind, component, input, "
                                          "output, dtype, shape, ...}")
    decoding: DecodingSpec = Field(default_factory=DecodingSpec,
                                   description="decoding contracts: {greedy: {}}")

    @field_validator("format", mode="before")
    @classmethod
    def _format_is_an_integer(cls, value: Any) -> Any:
        # Literal[1] would accept True (True == 1); a boolean is never a version number.
        if isinstance(value, bool):
            raise fail((), value, f"format must be the integer {FORMAT_VERSION}, got a boolean",
                       f"write format: {FORMAT_VERSION}")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> PackageSpec:
        vocab = f"[0, {self.vocab_size})"
        for key in ("bos_id", "eos_id"):
            token = getattr(self, key)
            if token is not None and not 0 <= token < self.vocab_size:
                raise fail((key,), token,
                           f"{key} {token} is outside the vocabulary {vocab}",
                           f"use a token id in {vocab}, or null")
        for i, prompt in enumerate(self.prompts):
            for j, token in enumerate(prompt):
                if not 0 <= token < self.vocab_size:
                    raise fail(("prompts", i, j), token,
                               f"prompt {i} holds token id {token} at position {j}, outside "
                               f"the vocabulary {vocab}",
                               f"use token ids in {vocab} (vocab_size is {self.vocab_size})")
            if len(prompt) > self.max_context:
                raise fail(("prompts", i), f"{len(prompt)} tokens",
                           f"prompt {i} has {len(prompt)} tokens, longer than max_context "
                           f"{self.max_context}",
                           f"shorten it to at most {self.max_context} tokens, or raise "
                           f"max_context")
        for cell_name, cell in self.state.items():
            if cell.component not in self.components:
                raise fail(("state", cell_name, "component"), cell.component,
                           f"state cell {cell_name!r} names component {cell.component!r}, "
                           f"which the package does not declare",
                           f"use one of the components: {', '.join(self.components)}")
            if cell.kind == "kv" and cell.update == "static":
                extent = cell.shape[cell.seq_axis]
                if extent != self.max_context:
                    raise fail(("state", cell_name, "shape"), cell.shape,
                               f"a static kv cell is a fixed buffer of max_context positions, "
                               f"but its sequence extent (axis {cell.seq_axis}) is {extent}, "
                               f"not max_context {self.max_context}",
                               f"set shape[{cell.seq_axis}] to {self.max_context}")
        self._ports_bound_once()
        return self

    def _ports_bound_once(self) -> None:
        """One graph input is fed by one thing; one graph output feeds one cell."""
        for comp_name, comp in self.components.items():
            seen_in: dict[str, tuple] = {}
            seen_out: dict[str, tuple] = {}
            bindings = [(seen_in, ("components", comp_name, "inputs", role), port)
                        for role, port in comp.inputs.items()]
            bindings += [(seen_in, ("state", cell_name, "input"), cell.input)
                         for cell_name, cell in self.state.items()
                         if cell.component == comp_name]
            bindings += [(seen_out, ("state", cell_name, "output"), cell.output)
                         for cell_name, cell in self.state.items()
                         if cell.component == comp_name]
            for seen, loc, port in bindings:
                if port in seen:
                    first = field_path(seen[port])
                    raise fail(loc, port,
                               f"graph port {port!r} of component {comp_name!r} is already "
                               f"bound by {first}",
                               "bind every graph port to exactly one role or state cell")
                seen[port] = loc

    # -- convenience -------------------------------------------------------------------------
    def state_of(self, component: str) -> dict[str, StateCellSpec]:
        """The state cells a component owns, in declaration order."""
        return {n: c for n, c in self.state.items() if c.component == component}

    def to_yaml(self) -> str:
        """package.yaml text for this spec (what a fixture builder writes)."""
        data = self.model_dump(mode="python")
        for cell in data["state"].values():
            if cell["kind"] == "recurrent":  # kv-only keys would only read as noise
                del cell["seq_axis"], cell["update"]
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def field_path(loc: tuple) -> str:
    """``("prompts", 0, 3)`` -> ``prompts[0][3]``; ``("state", "k0", "dtype")`` -> dotted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
