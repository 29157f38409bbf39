"""A Hugging Face ``config.json`` read, and every value the converter reads checked by name
before anything is built.

transformers' config classes keep whatever a config.json holds, so a missing or mistyped
value shows up late and under another name: a ``KeyError``, ``int('four')``, "18 tensors the
graph has no place for" for ``num_hidden_layers: -2``, or no error at all and a different
model (``sliding_window: true`` is a window of one key, ``attention_bias: "false"`` is
true). Each field has a kind here (a count, a positive number, a flag, token ids, ...);
a value that is not of its kind is refused naming the field, the value and the remedy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engines import json_text
from engines.errors import InputError
from harness.convert.hf_architectures import refuse
from harness.convert.kinds import (COUNT, FLAG, MAPPING, NAMES, POSITIVE, TEXT, TOKEN_IDS, Kind,
                                   required)

REMEDY = "fix config.json (transformers' save_pretrained writes a valid one)"


# every config field the converter reads, by kind (hf_architectures says what each means)
KINDS: dict[str, Kind] = {
    **{name: required(COUNT) for name in ("hidden_size", "intermediate_size",
                                          "num_hidden_layers", "num_attention_heads",
                                          "vocab_size", "max_position_embeddings")},
    "num_key_value_heads": COUNT, "head_dim": COUNT, "sliding_window": COUNT,
    "sliding_window_pattern": COUNT, "_sliding_window_pattern": COUNT, "pretraining_tp": COUNT,
    "rms_norm_eps": required(POSITIVE), "rope_theta": required(POSITIVE),
    "rope_local_base_freq": POSITIVE, "partial_rotary_factor": POSITIVE,
    **{name: required(POSITIVE) for name in ("embedding_multiplier", "attention_multiplier",
                                             "residual_multiplier", "logits_scaling",
                                             "query_pre_attn_scalar")},
    "attn_logit_softcapping": POSITIVE, "final_logit_softcapping": POSITIVE,
    **{name: FLAG for name in ("tie_word_embeddings", "attention_bias", "mlp_bias",
                               "use_sliding_window", "use_bidirectional_attention")},
    "hidden_act": TEXT, "hidden_activation": TEXT, "model_type": TEXT,
    "architectures": NAMES, "layer_types": NAMES,
    "rope_parameters": MAPPING, "rope_scaling": MAPPING,
    "bos_token_id": TOKEN_IDS, "eos_token_id": TOKEN_IDS,
}
NEEDED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "vocab_size")
# inside rope_parameters / rope_scaling (per layer type for Gemma3): numbers, never null
ROPE_NUMBERS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings", "partial_rotary_factor")
ROPE_NUMBER = required(POSITIVE)


def read_config(folder: Path) -> dict:
    """``folder/config.json`` parsed; a file that is not a JSON object is refused."""
    path = folder / "config.json"
    where = str(path)
    try:
        config = json_text.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise InputError(f"config.json is not valid JSON: {exc}", field="config.json",
                         value=str(folder), remedy=REMEDY, where=where) from None
    if not isinstance(config, dict):
        raise InputError(f"config.json holds a JSON {type(config).__name__}, not an object of "
                         f"fields", field="config.json", value=str(folder), remedy=REMEDY,
                         where=where)
    return config


def check_values(config: dict, where: str) -> None:
    """Refuse a needed field that is missing, and any field of ``KINDS`` whose value is not
    of its kind; then what the fields must satisfy together."""
    for name in NEEDED:
        if name not in config:
            raise InputError(f"config.json lacks {name}", field=name, value=None,
                             remedy=f"add {name} ({KINDS[name].what}); {REMEDY}", where=where)
    for name, kind in KINDS.items():
        if name in config:
            _check(name, config[name], kind, where)
    for field_name in ("rope_parameters", "rope_scaling"):
        _check_rope(field_name, config.get(field_name), where)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise refuse("num_key_value_heads", kv_heads, f"grouped-query attention shares each "
                     f"KV head among whole groups of the {heads} query heads",
                     f"use a divisor of num_attention_heads ({heads})", where)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim % 2:
        name = "head_dim" if config.get("head_dim") else "hidden_size"
        raise refuse(name, config[name], f"a head of {head_dim} channels cannot be rotated "
                     f"(RoPE turns pairs of channels)", "use an even head dimension", where)
    vocab = config["vocab_size"]
    for name in ("bos_token_id", "eos_token_id"):
        ids = config.get(name)
        outside = [t for t in (ids if isinstance(ids, list) else [ids])
                   if t is not None and t >= vocab]
        if outside:
            raise refuse(name, ids, f"token id {outside[0]} is outside the vocabulary "
                         f"[0, {vocab})", f"use a token id below vocab_size ({vocab}), or null",
                         where)


def _check(name: str, value: Any, kind: Kind, where: str) -> None:
    if value is None and kind.nullable:
        return
    if not kind.ok(value):
        raise refuse(name, value, f"must be {kind.what}", REMEDY, where)


def _check_rope(field_name: str, params: Any, where: str) -> None:
    """The numbers inside a RoPE mapping (and, for Gemma3, inside each layer type's)."""
    if not isinstance(params, dict):
        return
    for key, value in params.items():
        if isinstance(value, dict):
            _check_rope(f"{field_name}.{key}", value, where)
        elif key in ROPE_NUMBERS:
            _check(f"{field_name}.{key}", value, ROPE_NUMBER, where)
        elif key in ("rope_type", "type"):
            _check(f"{field_name}.{key}", value, TEXT, where)
