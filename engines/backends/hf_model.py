"""transformers' model of a package, built the way transformers itself builds it, for the
``hf`` engines (``engines.backends.hf``).

From the package's source checkpoint (found by ``checkpoint_source``): a GGUF through
transformers' GGUF loader (its configuration, its dequantisation, its un-permutation of the
Q/K rows; the load cached on disk), a Hugging Face folder from its ``config.json`` and the
architecture class it names. Where the checkpoint is not found, from the package's own
weights under the converter's record, for plain Llama / Qwen2 only: any other feature would
be rebuilt as a different model that agrees with the converter's mistakes.

Everything is built in float32 on the CPU; the engine casts and moves it.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from onnx import numpy_helper

from engines.cache_root import cache_root
from engines.errors import EngineUnavailable

# the converter's architecture record with every optional feature off (plain Llama / Qwen2)
PLAIN_FEATURES = {"rope_scaling": None, "rope_local_base": None, "output_bias": False,
                  "mlp_bias": False, "qk_norm": "none", "norm_placement": "pre",
                  "activation": "silu", "embed_scale": None, "attn_scale": None,
                  "residual_scale": None, "logits_divisor": None, "attn_softcap": None,
                  "final_softcap": None, "sliding_window": None, "sliding_layers": None,
                  "experts": 0, "experts_per_token": 0}
_LLAMA = ("llama", "LlamaForCausalLM")
_QWEN2 = ("qwen2", "Qwen2ForCausalLM")


def build_model(source, package, sidecar: dict, attention: str, fallback: str
                ) -> tuple[Any, dict[str, Any]]:
    """(the float32 model, its provenance): from ``source`` (a ``CheckpointSource``), or
    with none from the package's weights under ``sidecar``'s record (``fallback``: why the
    checkpoint was not found). ``attention``: transformers' attention implementation."""
    import torch
    import transformers

    if source is None:
        return (model_from_package(package, sidecar, attention, fallback),
                {"conversion": "the package's weights, the converter's architecture record",
                 "why": fallback})
    torch.manual_seed(0)  # any random init is overwritten; seeded to be repeatable
    if source.kind == "gguf":
        model = model_from_gguf(source.path, source.content_hash, attention)
        how = "transformers' GGUF loader"
    else:
        model = model_from_folder(source.path, attention)
        how = "transformers from_pretrained (config.json, its architecture class)"
    return model, {"conversion": how, "transformers": transformers.__version__,
                   "checkpoint": source.to_dict(), "architecture": type(model).__name__}


def model_from_gguf(path: Path, content_hash: str, attention: str):
    """transformers' GGUF loader (``gguf_load``): its configuration, its class for the
    GGUF's architecture, its tensors."""
    import torch
    import transformers

    config, state = gguf_load(str(path), content_hash)
    config._attn_implementation = attention
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise EngineUnavailable(
            f"transformers' GGUF loader left {sorted(set(missing) - tied)[:4]} unset and "
            f"{sorted(unexpected)[:4]} unused for {type(model).__name__}",
            field="checkpoint", value=str(path),
            remedy="use a GGUF architecture transformers supports, or its Hugging Face "
                   "folder")
    model.tie_weights()
    return model


def model_from_folder(path: Path, attention: str):
    """A Hugging Face folder: its config.json and the class its ``architectures`` names."""
    import torch
    import transformers

    names = json.loads((path / "config.json").read_text()).get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:  # no class named: transformers' choice for the config's model_type
        config = transformers.AutoConfig.from_pretrained(str(path))
        cls = transformers.AutoModelForCausalLM
    else:
        config = cls.config_class.from_pretrained(str(path))
    config._attn_implementation = attention
    return cls.from_pretrained(str(path), config=config, dtype=torch.float32)


def model_from_package(package, sidecar: dict, attention: str, fallback: str):
    """The package's own weights under the converter's architecture record (the fallback
    where the source checkpoint is not found)."""
    a = sidecar["architecture"]
    family = a["family"]
    if family not in _LLAMA + _QWEN2:
        raise EngineUnavailable(f"hf has no model class for architecture {family!r}",
                                field="architecture.family", value=family,
                                remedy=f"use one of: {', '.join(_LLAMA + _QWEN2)}")
    # the fallback rebuilds plain Llama / Qwen2 only: a record with any other feature
    # would be rebuilt as a different model and agree with the converter's mistakes
    extra = {k: a[k] for k, plain in PLAIN_FEATURES.items() if a.get(k, plain) != plain}
    if family in _LLAMA and a.get("attention_bias"):
        extra["attention_bias"] = True
    if extra:
        raise EngineUnavailable(
            f"the source checkpoint was not found ({fallback}), and the package's record "
            f"has features the plain {family} fallback cannot rebuild: {extra}",
            field="architecture", value=sorted(extra),
            remedy="put the source checkpoint where hf finds it (LOCKSTEP_CHECKPOINTS)")
    import torch
    import transformers

    spec = package.spec
    common = dict(vocab_size=a["vocab"], hidden_size=a["hidden"],
                  intermediate_size=a["ffn"], num_hidden_layers=a["layers"],
                  num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                  head_dim=a["head_dim"], max_position_embeddings=spec.max_context,
                  rms_norm_eps=a["rms_eps"], rope_theta=a["rope_base"],
                  tie_word_embeddings=a["tied"], hidden_act="silu",
                  bos_token_id=spec.bos_id, eos_token_id=spec.eos_id,
                  pad_token_id=spec.eos_id if spec.eos_id is not None else 0)
    if family in _QWEN2:
        config = transformers.Qwen2Config(use_sliding_window=False, **common)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        cls = transformers.LlamaForCausalLM
    config._attn_implementation = attention
    names = sidecar["weights"]["target"]
    inits = {t.name: t for t in package.component_model("target").graph.initializer}

    def get(key: str) -> np.ndarray:
        return numpy_helper.to_array(inits[names[key]])

    state = state_dict(get, a)
    torch.manual_seed(0)  # the random init is overwritten; seeded only to be repeatable
    model = cls(config)
    # widened to float32 first (exact from float16 and bfloat16), then cast once
    model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32, order="C"))
                           for k, v in state.items()}, strict=True)
    return model


def unpermute_pairs(w: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Rows laid out for adjacent-pair RoPE (2i, 2i+1) back to rotate-half order
    (i, i + head_dim/2), per head; ``w`` is [heads * head_dim, ...] or a bias vector."""
    rest = w.shape[1:]
    return (w.reshape(heads, head_dim // 2, 2, *rest).swapaxes(1, 2)
            .reshape(heads * head_dim, *rest))


def state_dict(get, a: dict) -> dict[str, np.ndarray]:
    """transformers' Llama/Qwen2 state dict from the package's weights (``get(key)``) under
    the converter's record ``a``."""
    pairs = a["rope_layout"] == "pairs"
    q_fix = (lambda w: unpermute_pairs(w, a["heads"], a["head_dim"])) if pairs else \
        (lambda w: w)
    k_fix = (lambda w: unpermute_pairs(w, a["kv_heads"], a["head_dim"])) if pairs else \
        (lambda w: w)
    sd = {"model.embed_tokens.weight": get("embed"), "model.norm.weight": get("final_norm"),
          "lm_head.weight": get("embed") if a["tied"] else get("head").T}
    for i in range(a["layers"]):
        p = f"model.layers.{i}."
        sd.update({
            p + "input_layernorm.weight": get(f"l{i}.attn_norm"),
            p + "post_attention_layernorm.weight": get(f"l{i}.mlp_norm"),
            p + "self_attn.q_proj.weight": q_fix(get(f"l{i}.wq").T),
            p + "self_attn.k_proj.weight": k_fix(get(f"l{i}.wk").T),
            p + "self_attn.v_proj.weight": get(f"l{i}.wv").T,
            p + "self_attn.o_proj.weight": get(f"l{i}.wo").T,
            p + "mlp.gate_proj.weight": get(f"l{i}.w_gate").T,
            p + "mlp.up_proj.weight": get(f"l{i}.w_up").T,
            p + "mlp.down_proj.weight": get(f"l{i}.w_down").T,
        })
        if a["attention_bias"]:
            sd[p + "self_attn.q_proj.bias"] = q_fix(get(f"l{i}.bq"))
            sd[p + "self_attn.k_proj.bias"] = k_fix(get(f"l{i}.bk"))
            sd[p + "self_attn.v_proj.bias"] = get(f"l{i}.bv")
    return sd


# -- transformers' GGUF loads, cached ------------------------------------------------------

_GGUF_LOADED: dict[str, tuple[Any, dict]] = {}


def gguf_load_folder() -> Path:
    """Where transformers' GGUF loads are cached (``lockstep cache list`` shows them)."""
    return cache_root() / "hf-gguf"


def gguf_load(path: str, content_hash: str) -> tuple[Any, dict]:
    """(configuration, float32 state dict) as transformers' GGUF loader reads them: its
    configuration from the metadata, its dequantisation and Q/K un-permutation
    (``load_gguf_checkpoint``, the tensors ``from_pretrained(..., gguf_file=...)`` loads,
    without needing accelerate). Loading takes ~20 s on 2 cores (the loader rebuilds its
    name map per module), so its output is cached on disk under ``$LOCKSTEP_CACHE/hf-gguf/``
    keyed by the checkpoint's content hash and transformers' version, and the last one is
    kept in memory (a fresh configuration copy per engine)."""
    import torch
    import transformers

    if content_hash not in _GGUF_LOADED:
        folder = (gguf_load_folder() /
                  f"{content_hash.partition(':')[2][:16]}-transformers-{transformers.__version__}")
        weights = folder / "model.safetensors"
        if weights.is_file() and (folder / "config.json").is_file():
            from safetensors.torch import load_file

            config = transformers.AutoConfig.from_pretrained(str(folder))
            state = load_file(str(weights))
        else:
            from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

            p = Path(path)
            config = transformers.AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
            skeleton = transformers.AutoModelForCausalLM.from_config(config)
            tensors = load_gguf_checkpoint(path, return_tensors=True,
                                           model_to_load=skeleton)["tensors"]
            state = {k: torch.as_tensor(v, dtype=torch.float32).contiguous()
                     for k, v in tensors.items()}
            _save_loaded(folder, config, state)
        _GGUF_LOADED.clear()
        _GGUF_LOADED[content_hash] = (config, state)
    config, state = _GGUF_LOADED[content_hash]
    return copy.deepcopy(config), state


def _save_loaded(folder: Path, config, state: dict) -> None:
    """Write the loader's output beside the other caches, renamed into place whole."""
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staged.mkdir()
    try:
        config.save_pretrained(str(staged))
        save_file(state, str(staged / "model.safetensors"))
        if folder.exists():
            shutil.rmtree(staged)  # published meanwhile by another process
        else:
            staged.rename(folder)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)  # a cache, never a reason to fail
