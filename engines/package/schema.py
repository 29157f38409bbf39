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

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

FORMAT_VERSION = 1
PACKAGE_FILE = "package.yaml"
TARGET = "target"  # the component greedy decoding and the oracle run

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


class ReferenceSpec(_Strict):
    """The package the oracle judges this one against (``engines.oracle.oracle_for``).

    A reduced-precision package (float16, bfloat16) computes the same function as a float32
    package of the same weights; the recompute oracle runs that *reference* package, and
    this package's streams are judged with this package's own dtype row. The reference is
    named as a sibling folder (same parent folder) and pinned by its content hash: a package
    never points at an arbitrary path, and a reference whose bytes changed is refused."""

    folder: PackageName = Field(description="the reference package's folder name, a sibling "
                                            "of this package's folder")
    content_hash: str = Field(description="package_content_hash of the reference folder "
                                          "(sha256:<64 hex digits>)")

    @field_validator("content_hash")
    @classmethod
    def _is_a_content_hash(cls, value: str) -> str:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
            raise fail((), value, "content_hash is not a package content hash",
                       "write sha256: followed by the 64 lowercase hex digits of the "
                       "reference folder's package_content_hash (lockstep convert writes it)")
        return value


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


# -- decoding.speculative -------------------------------------------------------------------
# Kinds: ``draft`` (a separate draft model with its own state cells, no carry); ``chained``
# (the proposer reads concat(embed(token) * scale, carry), fused into one input or as token +
# carry, carry seeded from a declared target output, target cells borrowed read-only);
# ``mtp`` (a multi-token-prediction head: like chained, the last hidden state seeds the carry
# and the next token's embedding is the other half; the head may own cells too);
# ``prompt-lookup`` (no component: the drafts are copied from the prompt and the tokens so
# far, after the latest earlier occurrence of their last max_ngram..min_ngram tokens,
# ``engines/workflow/prompt_lookup.py``). Checks that need the graphs (borrowed ports, the
# embedding initializer) live in ``ports.py``.
SPECULATIVE_KINDS = ("draft", "chained", "mtp", "prompt-lookup")
# kinds whose proposer runs no component: it drafts from token ids the host already holds,
# so it reads nothing back (claim 4's budget counts no proposer step for them)
MODEL_FREE_KINDS = ("prompt-lookup",)
MAX_WIDTH_LIMIT = 16  # verification runs W+1 positions in one forward: keep it bounded
MAX_NGRAM_LIMIT = 16  # the longest suffix a prompt lookup may match
# max_context bounds: a hard maximum above any released model's context (10M positions),
# and the state a full sequence implies (every kv cell grown or sized to max_context, plus
# the recurrent cells) within what one device or host can hold. A typo such as
# 1000000000000 is refused here, not met as an allocation failure mid-decode.
MAX_CONTEXT_LIMIT = 1 << 24  # positions
MAX_STATE_BYTES = 1 << 40  # 1 TiB
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class CarrySpec(_Strict):
    input: NonEmpty | None = Field(
        default=None, description="proposer graph input of role carry (omit when the carry "
                                  "travels inside the fused input)")
    output: NonEmpty = Field(description="proposer graph output that carries to the next step")
    seed: NonEmpty = Field(description="a declared target output role (e.g. hidden): its row "
                                       "at the last committed position seeds the carry")


class EmbeddingSpec(_Strict):
    component: Name = Field(description="the component whose initializer holds the token table")
    initializer: NonEmpty = Field(description="the initializer name of the [vocab, width] table")
    scale: float = Field(default=1.0, description="applied once to the table at load")


class SpeculativeSpec(_Strict):
    kind: Literal["draft", "chained", "mtp", "prompt-lookup"] = Field(
        description="draft | chained | mtp | prompt-lookup")
    proposer: Name | None = Field(default=None,
                                  description="the component that proposes (none for "
                                              "prompt-lookup, which runs no component)")
    target: Name = Field(default="target", description="the component that verifies")
    max_width: int = Field(ge=1, le=MAX_WIDTH_LIMIT,
                           description="widths 1..max_width are valid")
    borrows: dict[NonEmpty, Name] = Field(
        default_factory=dict, description="proposer graph input -> target-owned state cell, "
                                          "read-only, bound from the target's latest value")
    carry: CarrySpec | None = Field(default=None, description="chained/mtp: the folded carry")
    fused_input: Literal["embeddings"] | None = Field(
        default=None, description="the proposer input role fed concat(embed(token)*scale, "
                                  "carry)")
    embedding: EmbeddingSpec | None = Field(
        default=None, description="the token table used to build the fused input")
    rollback: list[Name] | None = Field(
        default=None, description="target kv cells truncated after a rejection "
                                  "(default: every target kv cell)")
    snapshot: list[Name] = Field(default_factory=list,
                                 description="target recurrent cells snapshotted before "
                                             "verification")
    max_ngram: int | None = Field(default=None, ge=1, le=MAX_NGRAM_LIMIT,
                                  description="prompt-lookup: the longest suffix matched")
    min_ngram: int | None = Field(default=None, ge=1, le=MAX_NGRAM_LIMIT,
                                  description="prompt-lookup: the shortest suffix matched")

    @model_validator(mode="after")
    def _shape_of_kind(self) -> SpeculativeSpec:
        if self.kind in MODEL_FREE_KINDS:
            return self._model_free()
        if self.proposer is None:
            raise fail(("proposer",), None,
                       f"a {self.kind} proposer is a component of the package, but none is "
                       f"named", "add proposer: <the component that proposes>, or use kind: "
                                 "prompt-lookup (drafts copied from the prompt, no component)")
        for key in ("max_ngram", "min_ngram"):
            if getattr(self, key) is not None:
                raise fail((key,), getattr(self, key),
                           f"{key} applies to prompt-lookup only; a {self.kind} proposer is "
                           f"a model", f"remove {key}, or set kind: prompt-lookup")
        if self.proposer == self.target:
            raise fail(("proposer",), self.proposer,
                       f"the proposer and the target are the same component {self.target!r}",
                       "name a separate proposer component (a drafter, an MTP head)")
        if self.kind == "draft":
            for key in ("carry", "fused_input", "embedding"):
                if getattr(self, key) is not None:
                    raise fail((key,), _plain(getattr(self, key)),
                               f"{key} applies to chained and mtp proposers; a draft model "
                               f"keeps its own state cells instead",
                               f"remove {key}, or set kind: chained")
            return self
        if self.carry is None:
            raise fail(("carry",), None,
                       f"a {self.kind} proposer folds a carry from step to step, but no carry "
                       f"(and so no carry seed) is declared",
                       "add carry: {output: <proposer carry output>, seed: <target output "
                       "role, e.g. hidden>} (and input: when not fused)")
        if self.fused_input is not None:
            if self.embedding is None:
                raise fail(("embedding",), None,
                           "the fused input concat(embed(token) * scale, carry) needs a token "
                           "table, but no embedding is declared",
                           "add embedding: {component: <name>, initializer: <table>, "
                           "scale: 1.0}")
            if self.carry.input is not None:
                raise fail(("carry", "input"), self.carry.input,
                           "the carry travels inside the fused input, so carry.input would "
                           "bind a second port to it",
                           "remove carry.input, or remove fused_input to feed token and carry "
                           "separately")
        elif self.carry.input is None:
            raise fail(("carry", "input"), None,
                       "without fused_input the carry needs its own proposer input",
                       "add carry.input: <proposer input of role carry>, or set "
                       "fused_input: embeddings")
        elif self.embedding is not None:
            raise fail(("embedding",), _plain(self.embedding),
                       "an embedding is only used to build a fused input, and none is declared",
                       "add fused_input: embeddings, or remove embedding")
        return self

    def _model_free(self) -> SpeculativeSpec:
        """prompt-lookup: no proposer component and nothing a component needs; both n-gram
        bounds, the shorter at most the longer."""
        if self.proposer is not None:
            raise fail(("proposer",), self.proposer,
                       f"a {self.kind} proposer runs no component: it copies drafts from the "
                       f"prompt and the tokens so far",
                       "remove proposer, or use kind: draft | chained | mtp for a model "
                       "proposer")
        for key in ("borrows", "carry", "fused_input", "embedding"):
            value = getattr(self, key)
            if value:
                raise fail((key,), _plain(value),
                           f"{key} feeds a proposer component, and a {self.kind} proposer has "
                           f"none", f"remove {key}")
        for key, what in (("max_ngram", "the longest"), ("min_ngram", "the shortest")):
            if getattr(self, key) is None:
                raise fail((key,), None,
                           f"a {self.kind} proposer needs {key}: {what} run of final tokens "
                           f"it looks up earlier in the sequence",
                           "add max_ngram: 3 and min_ngram: 1 (lockstep convert "
                           "--prompt-lookup writes them)")
        if self.min_ngram > self.max_ngram:
            raise fail(("min_ngram",), self.min_ngram,
                       f"min_ngram {self.min_ngram} is above max_ngram {self.max_ngram}",
                       f"use a min_ngram in 1..{self.max_ngram}")
        return self


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


class DecodingSpec(_Strict):
    greedy: GreedySpec = Field(default_factory=GreedySpec,
                               description="greedy decoding contract: {}")
    speculative: SpeculativeSpec | None = Field(
        default=None, description="null, or {kind, proposer, target, max_width, borrows, "
                                  "carry, fused_input, embedding, rollback, snapshot}")

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative_has_a_kind(cls, value: Any) -> Any:
        # A mapping without kind is most often a leftover or a guess at the format; say
        # what the section needs rather than listing every missing field.
        if isinstance(value, dict) and "kind" not in value:
            raise fail((), value,
                       "the speculative section has no kind, so it declares no proposer (a "
                       "package without speculative decoding keeps the reserved value null)",
                       "add kind: draft | chained | mtp with proposer and max_width (or kind: "
                       "prompt-lookup with max_width, max_ngram and min_ngram), or set "
                       "speculative: null")
        return value


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
    reference: ReferenceSpec | None = Field(
        default=None, description="optional: {folder, content_hash} of the package the "
                                  "oracle runs to judge this one (its float32 twin)")
    original: ReferenceSpec | None = Field(
        default=None, description="optional: {folder, content_hash} of the float package "
                                  "this one's quantized checkpoint was made from; quality "
                                  "beside the verdict is measured against it, never the "
                                  "verdict (harness.quality)")

    @field_validator("format", mode="before")
    @classmethod
    def _format_is_an_integer(cls, value: Any) -> Any:
        # Literal[1] would accept True (True == 1); a boolean is never a version number.
        if isinstance(value, bool):
            raise fail((), value, f"format must be the integer {FORMAT_VERSION}, got a boolean",
                       f"write format: {FORMAT_VERSION}")
        return value

    def state_bytes(self, positions: int) -> int:
        """Bytes of every state cell holding ``positions`` positions (kv cells at that
        sequence extent, recurrent cells at their fixed shape)."""
        total = 0
        for cell in self.state.values():
            n = DTYPE_BYTES[cell.dtype]
            for axis, extent in enumerate(cell.shape):
                n *= positions if cell.kind == "kv" and axis == cell.seq_axis else extent
            total += n
        return total

    def _context_is_bounded(self) -> None:
        if self.max_context > MAX_CONTEXT_LIMIT:
            raise fail(("max_context",), self.max_context,
                       f"max_context {self.max_context} is above the hard maximum "
                       f"{MAX_CONTEXT_LIMIT} positions",
                       f"declare the positions the package really holds, at most "
                       f"{MAX_CONTEXT_LIMIT}")
        per_position = self.state_bytes(1) - self.state_bytes(0)
        full = self.state_bytes(self.max_context)
        if per_position and full > MAX_STATE_BYTES:
            fits = (MAX_STATE_BYTES - self.state_bytes(0)) // per_position
            raise fail(("max_context",), self.max_context,
                       f"a full sequence of max_context {self.max_context} positions needs "
                       f"{full / (1 << 30):.0f} GiB of state ({per_position} bytes a position "
                       f"over the kv cells), more than the {MAX_STATE_BYTES >> 30} GiB limit",
                       f"use max_context at most {fits}, what the state cells' shapes allow")

    @model_validator(mode="after")
    def _cross_field(self) -> PackageSpec:
        self._context_is_bounded()
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
        if TARGET not in self.components:
            raise fail(("components",), ", ".join(self.components),
                       f"no component is named {TARGET!r}: greedy decoding and the oracle run "
                       f"the component of that name",
                       f"name the component that decodes {TARGET} (and the components of "
                       f"its state cells with it)")
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
        if self.decoding.speculative is not None:
            self._speculative_refers_to_what_exists(self.decoding.speculative)
        self._ports_bound_once()
        return self

    def _speculative_refers_to_what_exists(self, sp: SpeculativeSpec) -> None:
        """The speculative section names components, roles and cells the package declares."""
        base = ("decoding", "speculative")
        comps = ", ".join(self.components)
        for key in ("proposer", "target"):
            name = getattr(sp, key)
            if name is None:  # a proposer that runs no component (prompt-lookup)
                continue
            if name not in self.components:
                raise fail((*base, key), name,
                           f"speculative {key} {name!r} is not a declared component",
                           f"use one of the components: {comps}")
        target_cells = self.state_of(sp.target)
        owned = ", ".join(target_cells) or "(none)"
        for port, cell in sp.borrows.items():
            if cell not in self.state:
                raise fail((*base, "borrows", port), cell,
                           f"proposer input {port!r} borrows state cell {cell!r}, which the "
                           f"package does not declare",
                           f"borrow one of the target's cells: {owned}")
            if self.state[cell].component != sp.target:
                raise fail((*base, "borrows", port), cell,
                           f"proposer input {port!r} borrows state cell {cell!r}, which "
                           f"component {self.state[cell].component!r} owns, not the target "
                           f"{sp.target!r}; a borrow is bound from the target's latest value",
                           f"borrow one of the target's cells: {owned}")
        target = self.components[sp.target]
        for role in ("tokens", "logits"):
            side = target.inputs if role == "tokens" else target.outputs
            if role not in side:
                raise fail(("components", sp.target, "inputs" if role == "tokens" else
                            "outputs"), dict(side),
                           f"the target {sp.target!r} verifies drafts, so it needs the {role} "
                           f"role", f"bind {role} on the target")
        if sp.proposer is not None:
            self._proposer_refers_to_what_exists(sp)
        self._rollback_and_snapshot_cover_the_target(sp)

    def _proposer_refers_to_what_exists(self, sp: SpeculativeSpec) -> None:
        """A proposer component's roles, carry, fused input and embedding table."""
        base = ("decoding", "speculative")
        proposer = self.components[sp.proposer]
        target = self.components[sp.target]
        if "logits" not in proposer.outputs:
            raise fail(("components", sp.proposer, "outputs"), dict(proposer.outputs),
                       f"the proposer {sp.proposer!r} has no logits output to draw drafts from",
                       "bind outputs.logits of the proposer")
        if sp.kind == "draft" and "tokens" not in proposer.inputs:
            raise fail(("components", sp.proposer, "inputs"), dict(proposer.inputs),
                       f"a draft model is fed tokens, but {sp.proposer!r} binds no tokens role",
                       "bind inputs.tokens of the draft model")
        if sp.carry is not None:
            if sp.carry.seed not in target.outputs:
                raise fail((*base, "carry", "seed"), sp.carry.seed,
                           f"carry seed {sp.carry.seed!r} is not a declared output role of the "
                           f"target {sp.target!r}",
                           f"use one of the target's output roles: {', '.join(target.outputs)}"
                           f" (declare the role under components.{sp.target}.outputs first)")
            for side, port in (("input", sp.carry.input), ("output", sp.carry.output)):
                declared = (proposer.inputs if side == "input" else proposer.outputs).get("carry")
                if port is not None and declared is not None and declared != port:
                    raise fail((*base, "carry", side), port,
                               f"carry.{side} {port!r} differs from the proposer's carry role "
                               f"{declared!r}", f"set carry.{side}: {declared}")
        if sp.fused_input is not None and sp.fused_input not in proposer.inputs:
            raise fail((*base, "fused_input"), sp.fused_input,
                       f"fused_input names role {sp.fused_input!r}, which the proposer "
                       f"{sp.proposer!r} does not bind",
                       f"bind components.{sp.proposer}.inputs.{sp.fused_input} to the graph "
                       f"input fed concat(embed(token) * scale, carry)")
        if sp.embedding is not None and sp.embedding.component not in self.components:
            raise fail((*base, "embedding", "component"), sp.embedding.component,
                       f"embedding component {sp.embedding.component!r} is not declared",
                       f"use one of the components: {', '.join(self.components)}")

    def _rollback_and_snapshot_cover_the_target(self, sp: SpeculativeSpec) -> None:
        """rollback lists target kv cells (all of them), snapshot every recurrent one."""
        base = ("decoding", "speculative")
        target_cells = self.state_of(sp.target)
        kv = [n for n, c in target_cells.items() if c.kind == "kv"]
        recurrent = [n for n, c in target_cells.items() if c.kind == "recurrent"]
        for i, cell in enumerate(sp.rollback or []):
            spec = self.state.get(cell)
            if spec is None or spec.component != sp.target or spec.kind != "kv":
                what = ("is not a declared cell" if spec is None else
                        f"is owned by {spec.component!r}" if spec.component != sp.target else
                        "is recurrent (it cannot be truncated: snapshot it instead)")
                raise fail((*base, "rollback", i), cell,
                           f"rollback cell {cell!r} {what}; rollback truncates the target's "
                           f"kv cells", f"list target kv cells only: {', '.join(kv) or '(none)'}")
        if sp.rollback is not None:
            missing = [n for n in kv if n not in sp.rollback]
            if missing:
                raise fail((*base, "rollback"), list(sp.rollback),
                           f"target kv cell(s) {', '.join(missing)} would keep rejected "
                           f"positions after a partial accept",
                           f"list every target kv cell ({', '.join(kv)}), or omit rollback")
        for i, cell in enumerate(sp.snapshot):
            spec = self.state.get(cell)
            if spec is None or spec.component != sp.target or spec.kind != "recurrent":
                what = ("is not a declared cell" if spec is None else
                        f"is owned by {spec.component!r}" if spec.component != sp.target else
                        "is a kv cell (roll it back by truncation: list it under rollback)")
                raise fail((*base, "snapshot", i), cell,
                           f"snapshot cell {cell!r} {what}; snapshots hold the target's "
                           f"recurrent cells",
                           f"list target recurrent cells only: {', '.join(recurrent) or '(none)'}")
        missing = [n for n in recurrent if n not in sp.snapshot]
        if missing:
            raise fail((*base, "snapshot"), list(sp.snapshot),
                       f"target recurrent cell(s) {', '.join(missing)} cannot be truncated, so "
                       f"a partial accept could not roll them back without a snapshot",
                       f"add them to snapshot: {', '.join(recurrent)}")

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
            sp = self.decoding.speculative
            if sp is not None and sp.proposer == comp_name:
                base = ("decoding", "speculative")
                bindings += [(seen_in, (*base, "borrows", port), port) for port in sp.borrows]
                comp_carry = (comp.inputs.get("carry"), comp.outputs.get("carry"))
                if sp.carry is not None and sp.carry.input not in (None, comp_carry[0]):
                    bindings.append((seen_in, (*base, "carry", "input"), sp.carry.input))
                if sp.carry is not None and sp.carry.output != comp_carry[1]:
                    bindings.append((seen_out, (*base, "carry", "output"), sp.carry.output))
            for seen, loc, port in bindings:
                if port in seen:
                    first = field_path(seen[port])
                    raise fail(loc, port,
                               f"graph port {port!r} of component {comp_name!r} is already "
                               f"bound by {first}",
                               "bind every graph port to exactly one role or state cell")
                seen[port] = loc

    # -- convenience -------------------------------------------------------------------------
    def rollback_cells(self) -> list[str]:
        """The target kv cells a partial accept truncates (declared, or every one)."""
        sp = self.decoding.speculative
        if sp is None:
            return []
        if sp.rollback is not None:
            return list(sp.rollback)
        return [n for n, c in self.state_of(sp.target).items() if c.kind == "kv"]

    def state_of(self, component: str) -> dict[str, StateCellSpec]:
        """The state cells a component owns, in declaration order."""
        return {n: c for n, c in self.state.items() if c.component == component}

    def to_yaml(self) -> str:
        """package.yaml text for this spec (what a fixture builder writes)."""
        data = self.model_dump(mode="python")
        for cell in data["state"].values():
            if cell["kind"] == "recurrent":  # kv-only keys would only read as noise
                del cell["seq_axis"], cell["update"]
        for optional in ("reference", "original"):  # a package without one never names it
            if data[optional] is None:
                del data[optional]
        sp = data["decoding"]["speculative"]
        for key in ("proposer", "max_ngram", "min_ngram"):  # what the kind leaves out
            if sp is not None and sp[key] is None:
                del sp[key]
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
