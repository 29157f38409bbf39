"""What a family's GGUF means to the LLaMA graph beyond what every GGUF the converter reads
shares (``gguf_reader``: the tensor names, the ``<arch>.*`` keys, RoPE scaling).

One ``GgufLayout`` per family read from GGUF (the ``gguf`` of its row in ``architectures``):
how llama.cpp laid the Q/K rows out, the block tensors whose meaning differs, the metadata
keys the family adds, and its reader function: the ``Architecture`` features that only its
metadata or its tensors say.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engines.errors import InputError
from engines.gguf_header import field_value
from harness.convert.kinds import POSITIVE, Kind


@dataclass(frozen=True)
class GgufLayout:
    # "pairs": llama.cpp permuted the Q/K rows, so RoPE rotates adjacent channels
    rope_layout: Literal["pairs", "halves"]
    # block tensors whose meaning differs from gguf_reader.BLOCK_TENSORS' (None: not there)
    block_tensors: Mapping[str, str | None] = field(default_factory=dict)
    # <arch>.* metadata the family adds to gguf_reader.ARCH_KEYS, with the kind its value
    # must be (None: read as it is)
    extra_keys: Mapping[str, Kind | None] = field(default_factory=dict)
    # (reader, arch, where) -> the Architecture features its metadata or tensors say
    read: Callable[[Any, str, str], dict] | None = None
    note: str = ""  # what its GGUFs carry that the graph models (docs/CONVERTER.md)


def read_olmo2(reader, arch: str, where: str) -> dict:
    """OLMo2: norms after attention and the MLP; its q/k norms span the whole projection."""
    q_norm = any(t.name.endswith("attn_q_norm.weight") for t in reader.tensors)
    return {"norm_placement": "post", **({"qk_norm": "full"} if q_norm else {})}


# Granite's four multipliers: metadata key -> Architecture field
GRANITE_SCALES = {"embedding_scale": "embed_scale", "attention.scale": "attn_scale",
                  "residual_scale": "residual_scale", "logit_scale": "logits_divisor"}


def read_granite(reader, arch: str, where: str) -> dict:
    out = {}
    for key, name in GRANITE_SCALES.items():
        value = field_value(reader, f"{arch}.{key}")
        if value is None or not float(value) > 0:
            raise InputError(f"Granite's {key} is part of the model", field=f"{arch}.{key}",
                             value=value, remedy="re-export the checkpoint with every "
                             "Granite multiplier", where=where)
        out[name] = float(value)
    return out


OLMO2 = GgufLayout("halves", block_tensors={"post_attention_norm.weight": "attn_post_norm",
                                            "post_ffw_norm.weight": "mlp_post_norm",
                                            "ffn_norm.weight": None}, read=read_olmo2)
GRANITE = GgufLayout("pairs", extra_keys={key: POSITIVE for key in GRANITE_SCALES},
                     read=read_granite, note="its multipliers as metadata")
PHI3 = GgufLayout("halves", block_tensors={"attn_qkv.weight": "fused:qkv",
                                           "ffn_up.weight": "fused:gate_up"},
                  extra_keys={"attention.sliding_window": None},
                  note="fused tensors, sliding window")
