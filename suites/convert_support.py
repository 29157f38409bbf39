"""Tiny synthetic checkpoints for the converter suites: a GGUF written with the gguf
package's own writer (quantized with its own quantizer) and Hugging Face folders written
with safetensors, so the converter is tested against the formats' reference tools."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]  # "1 2" must never apply: digits split first


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int]]:
    tokens = SPECIALS + byte_level_alphabet() + ["Ġt", "he", "Ġthe", "12"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types


DIMS = dict(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=96)


def tiny_weights(seed: int, vocab: int, bias: bool = False, tied: bool = True) -> dict:
    """HF-named [out, in] float32 weights, scaled so activations stay O(1)."""
    d = DIMS
    rng = np.random.default_rng(seed)
    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]

    def normal(shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((vocab, d["hidden"]), 1.0),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(d["hidden"])).astype(np.float32)}
    if not tied:
        w["lm_head.weight"] = normal((vocab, d["hidden"]), 1.0)
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d["hidden"])).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d["hidden"])).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = normal((q, d["hidden"]), d["hidden"])
        w[p + "self_attn.k_proj.weight"] = normal((kv, d["hidden"]), d["hidden"])
        w[p + "self_attn.v_proj.weight"] = normal((kv, d["hidden"]), d["hidden"])
        w[p + "self_attn.o_proj.weight"] = normal((d["hidden"], q), q)
        w[p + "mlp.gate_proj.weight"] = normal((d["ffn"], d["hidden"]), d["hidden"])
        w[p + "mlp.up_proj.weight"] = normal((d["ffn"], d["hidden"]), d["hidden"])
        w[p + "mlp.down_proj.weight"] = normal((d["hidden"], d["ffn"]), d["ffn"])
        if bias:
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{name}_proj.bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
    return w


# GGUF tensor types used per weight: every family the converter claims
GGUF_TYPES = {"token_embd.weight": "Q8_0", "attn_q.weight": "Q4_1", "attn_k.weight": "Q8_0",
              "attn_v.weight": "F16", "attn_output.weight": "Q4_0",
              "ffn_gate.weight": "Q5_1", "ffn_up.weight": "Q5_0", "ffn_down.weight": "BF16",
              "attn_norm.weight": "F32", "ffn_norm.weight": "F32", "output_norm.weight": "F32"}


def write_tiny_gguf(path: Path, seed: int = 3, arch: str = "llama",
                    override_type: tuple[str, str] | None = None) -> Path:
    """A 2-block LLaMA GGUF, tied head, byte-level BPE with ChatML specials."""
    import gguf

    d = DIMS
    tokens, types = tiny_vocab()
    hf = tiny_weights(seed, len(tokens))
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight"}
    hf_layer = {"input_layernorm.weight": "attn_norm.weight",
                "post_attention_layernorm.weight": "ffn_norm.weight",
                "self_attn.q_proj.weight": "attn_q.weight",
                "self_attn.k_proj.weight": "attn_k.weight",
                "self_attn.v_proj.weight": "attn_v.weight",
                "self_attn.o_proj.weight": "attn_output.weight",
                "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(d["layers"]):
        for k, v in hf_layer.items():
            names[f"model.layers.{i}.{k}"] = f"blk.{i}.{v}"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(d["layers"])
    w.add_context_length(256)
    w.add_embedding_length(d["hidden"])
    w.add_feed_forward_length(d["ffn"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for hf_name, value in hf.items():
        name = names[hf_name]
        kind = GGUF_TYPES[name.split(".", 2)[-1] if name.startswith("blk.") else name]
        if override_type and name == override_type[0]:
            kind = override_type[1]
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            w.add_tensor(name, value)
        elif kind == "I32":
            w.add_tensor(name, value.astype(np.int32), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_hf(folder: Path, arch: str = "LlamaForCausalLM", seed: int = 5,
                  tied: bool = False, dtype: str = "float32", vocab: int = 300,
                  extra_config: dict | None = None) -> Path:
    """A 2-block HF folder: config.json + model.safetensors (written by safetensors)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = DIMS
    weights = tiny_weights(seed, vocab, bias=arch == "Qwen2ForCausalLM", tied=tied)
    if dtype == "bfloat16":
        import ml_dtypes

        weights = {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}
    save_file(weights, str(folder / "model.safetensors"))
    config = {"architectures": [arch], "hidden_size": d["hidden"],
              "intermediate_size": d["ffn"], "num_hidden_layers": d["layers"],
              "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"],
              "head_dim": d["head_dim"], "vocab_size": vocab, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "tie_word_embeddings": tied,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
              **(extra_config or {})}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
