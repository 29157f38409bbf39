"""A variant's ``inference_metadata.yaml`` (or ``.json``): what lockstep reads of it.

The decoder's graph ABI, in the ``model.io`` form: the token input, the logits output, an
optional position-ids input, hidden output and attention-mask input, and the KV cache as
past/present pairs (``kv_inputs``/``kv_outputs``, a growing cache) or as a fixed buffer
written by TensorScatter (``static_cache``: write-index and sequence-length inputs, key
and value cache inputs and outputs per layer). Beside it ``model.max_sequence_length``
and ``model.vocab_size``, and the special tokens under ``package.tokenizer``.

Whatever has no lockstep meaning is refused by name with the file and a remedy, never
dropped: an embeddings-driven or encoder-decoder graph, a KV cache owned by another
graph, loop-carried state pairs, optional-input contracts, an unknown ``io`` key, a
capability lockstep cannot honour, and the ``pipeline`` workflow form (not imported yet).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engines.errors import PackageError

# required_capabilities whose whole meaning is in the graph lockstep runs anyway
HONOURED_CAPABILITIES = frozenset({"kv_cache", "static_cache", "grouped_query_attention"})
# model.io keys lockstep binds; every other declared key is refused (NO_MEANING says why)
NO_MEANING = {
    "inputs_embeds_input": "lockstep feeds token ids; an embeddings-driven graph has no "
                           "tokens role to judge",
    "encoder_hidden_states_input": "encoder-decoder graphs are not lockstep packages",
    "audio_features_input": "encoder-decoder graphs are not lockstep packages",
    "cross_kv_inputs": "encoder-decoder graphs are not lockstep packages",
    "cross_kv_outputs": "encoder-decoder graphs are not lockstep packages",
    "state_pairs": "loop-carried state pairs are not imported yet (a recurrent cell needs "
                   "its shape and reset rule)",
    "optional_inputs": "lockstep feeds every input it binds on every step; it has no "
                       "absent-input contract",
}


class StaticCache(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    write_indices_input: str = Field(min_length=1)
    kv_sequence_length_input: str = Field(min_length=1)
    key_cache_inputs: list[str] = Field(min_length=1)
    value_cache_inputs: list[str] = Field(min_length=1)
    key_cache_outputs: list[str] = Field(min_length=1)
    value_cache_outputs: list[str] = Field(min_length=1)


class DecoderIO(BaseModel):
    """``model.io``: the ports lockstep binds (other declared keys are refused first)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    sequence_source: Literal["token_ids"] | None = None
    kv_ownership: Literal["owned"] | None = None
    kv_layout: Literal["head_major_bnsh", "seq_major_bsnh"] | None = None
    token_input: str | None = None
    attention_mask_input: str | None = None
    position_ids_input: str | None = None
    logits_output: str | None = None
    hidden_output: str | None = None
    kv_inputs: list[str] | None = None
    kv_outputs: list[str] | None = None
    aliasing: str | None = None  # a runtime buffer-reuse hint: no effect on the values
    static_cache: StaticCache | None = None


@dataclass(frozen=True)
class Metadata:
    io: DecoderIO
    max_sequence_length: int | None
    vocab_size: int | None
    bos_id: int | None
    eos_id: int | None


def read_metadata(path: Path) -> Metadata:
    """The metadata file at ``path``, checked; every refusal names the file and the field."""
    where = str(path)
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise PackageError(f"{path.name} cannot be read ({err})", field=path.name,
                           value=str(path), remedy="write it as YAML or JSON",
                           where=where) from None
    data = data or {}
    if not isinstance(data, dict):
        raise PackageError(f"{path.name} is not a mapping", field=path.name,
                           value=type(data).__name__, remedy="write key: value pairs",
                           where=where)
    if data.get("pipeline") is not None:
        raise PackageError("the pipeline workflow form is not imported yet", field="pipeline",
                           value=sorted(data["pipeline"]) if isinstance(data["pipeline"], dict)
                           else data["pipeline"],
                           remedy="declare the decoder's ports under model.io (the legacy "
                                  "form onnx-genai still reads)", where=where)
    needed = [c for c in data.get("required_capabilities") or []
              if c not in HONOURED_CAPABILITIES]
    if needed:
        raise PackageError("the package requires capabilities lockstep does not have",
                           field="required_capabilities", value=needed,
                           remedy=f"lockstep honours {', '.join(sorted(HONOURED_CAPABILITIES))}; "
                                  f"run this package on onnx-genai itself", where=where)
    model = data.get("model") or {}
    io = model.get("io") if isinstance(model, dict) else None
    if not isinstance(io, dict):
        raise PackageError("model.io is missing: lockstep needs the decoder's ports declared",
                           field="model.io", value=io,
                           remedy="declare token_input, logits_output and the cache "
                                  "(static_cache, or kv_inputs/kv_outputs) under model.io",
                           where=where)
    for key, why in NO_MEANING.items():
        if io.get(key):
            raise PackageError(f"model.io.{key} has no lockstep meaning: {why}",
                               field=f"model.io.{key}", value=io[key],
                               remedy="import a decoder driven by token ids that owns its "
                                      "cache, or run this package on onnx-genai itself",
                               where=where)
    try:
        parsed = DecoderIO.model_validate(io)
    except ValidationError as err:
        first = err.errors()[0]
        loc = "model.io." + ".".join(str(p) for p in first["loc"])
        raise PackageError(f"{loc} has no lockstep meaning here: {first['msg']}", field=loc,
                           value=first.get("input"),
                           remedy="declare only the decoder ports lockstep binds (token_input, "
                                  "logits_output, position_ids_input, hidden_output, "
                                  "attention_mask_input, kv_inputs/kv_outputs or "
                                  "static_cache), owned by this graph", where=where) from None
    special = _dig(data, "package", "tokenizer", "special_tokens") or {}
    return Metadata(parsed, _positive(model, "max_sequence_length", where),
                    _positive(model, "vocab_size", where), _token(special, "bos", where),
                    _token(special, "eos", where))


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _positive(model: dict, key: str, where: str) -> int | None:
    value = model.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PackageError(f"model.{key} is not a positive integer", field=f"model.{key}",
                           value=value, remedy="write a positive whole number", where=where)
    return value


def _token(special: dict, role: str, where: str) -> int | None:
    value = _dig(special, role, "id")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PackageError(f"the {role} token id is not a token id",
                           field=f"package.tokenizer.special_tokens.{role}.id", value=value,
                           remedy="write a non-negative whole number", where=where)
    return value
