"""Tiny random checkpoints of every architecture the converter supports, built by
transformers itself (its config and model classes, ``save_pretrained``), no network.

Weights are redrawn at O(1) scale (transformers' own init, std 0.02, leaves every logit near
zero and every step a near-tie); norms near 1 (Gemma's near 0: it scales by 1 + w).
``transformers_greedy`` is the reference: the class transformers picks from the config,
eager attention, float32, no cache (each step recomputes the prefix, like lockstep's oracle).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# architectures[0] -> (transformers config class, fields that make it that architecture)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "llama3": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "mistral": ("MistralConfig", {}),
    "granite": ("GraniteConfig", {"embedding_multiplier": 2.0, "attention_multiplier": 0.2,
                                  "residual_multiplier": 0.5, "logits_scaling": 4.0}),
    "olmo2": ("Olmo2Config", {}),
    "phi3": ("Phi3Config", {}),
    "gemma2": ("Gemma2Config", {"attn_logit_softcapping": 8.0, "final_logit_softcapping": 6.0,
                                "query_pre_attn_scalar": 24}),
    "gemma3": ("Gemma3TextConfig", {"query_pre_attn_scalar": 24}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}
GEMMA = ("gemma2", "gemma3")
EMBED_STD = 0.3


@dataclass(frozen=True)
class TinySpec:
    family: str
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 128
    tied: bool = False
    bias: bool = False  # attention (and, for Llama/Granite, MLP) biases where the class has them
    window: int | None = None  # sliding window (Mistral, Phi3, Gemma)
    rope: str = "default"  # default | linear | llama3 (Llama family)
    extra: dict = field(default_factory=dict)

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


def hf_config(spec: TinySpec):
    import transformers

    cls_name, fixed = FAMILIES[spec.family]
    cfg = dict(hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
               num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
               num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
               vocab_size=spec.vocab, max_position_embeddings=256,
               tie_word_embeddings=spec.tied, bos_token_id=1, eos_token_id=None,
               pad_token_id=0)
    cfg.update(fixed)
    if spec.family == "phi3":
        cfg.pop("head_dim")  # Phi3 derives it
    if spec.rope == "linear" and spec.family == "gemma3":  # scaled full layers, plain local
        cfg["rope_parameters"] = {
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    elif spec.rope == "linear":
        cfg["rope_parameters"] = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    elif spec.rope == "llama3":
        cfg["rope_parameters"] = FAMILIES["llama3"][1]["rope_parameters"]
    if spec.bias:
        if spec.family in ("llama", "llama3", "granite"):
            cfg.update(attention_bias=True, mlp_bias=True)
        elif spec.family not in ("qwen2", "mistral", "phi3", "mixtral"):
            cfg["attention_bias"] = True
    if spec.family in ("mistral", "phi3", "mixtral", *GEMMA):
        cfg["sliding_window"] = spec.window
    if spec.family in GEMMA:
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        pattern = 2 if spec.family == "gemma2" else 3
        cfg["layer_types"] = ["full_attention" if spec.window is None or (i + 1) % pattern == 0
                              else "sliding_attention" for i in range(spec.layers)]
        if spec.window is None:
            cfg["sliding_window"] = 4096
    cfg.update(spec.extra)
    return getattr(transformers, cls_name)(**cfg)


def build_model(spec: TinySpec, seed: int):
    """The transformers model for ``spec`` with seeded O(1)-scale weights, float32, eval."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(spec)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = param.shape
            noise = torch.randn(shape, generator=gen)
            if "norm" in name:
                param.copy_(0.1 * noise if spec.family in GEMMA else 1 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise * EMBED_STD)
            else:
                param.copy_(noise / math.sqrt(shape[-1]))
        if not spec.tied and model.get_output_embeddings() is not None:
            head = model.get_output_embeddings().weight
            head.copy_(torch.randn(head.shape, generator=gen) / math.sqrt(head.shape[-1]) * 4)
    return model.float().eval()


def save_checkpoint(spec: TinySpec, seed: int, folder: Path):
    """Build and ``save_pretrained`` (safetensors); returns (folder, model)."""
    model = build_model(spec, seed)
    model.save_pretrained(str(folder))
    return Path(folder), model


def transformers_greedy(model, prompt: list[int], tokens: int) -> tuple[list[int], np.ndarray]:
    """Greedy ids by recomputing the whole prefix each step, and the prompt's logits."""
    import torch

    ids = list(prompt)
    first = None
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids]), use_cache=False).logits[0]
            if first is None:
                first = logits.numpy().copy()
            ids.append(int(torch.argmax(logits[-1])))
    return ids[len(prompt):], first


# -- the same checkpoints as GGUF, named and laid out as llama.cpp's converter writes them ---

GGUF_ARCH = {"llama": "llama", "llama3": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "granite": "granite", "olmo2": "olmo2", "phi3": "phi3"}
PAIRWISE_ROPE = ("llama", "granite")  # llama.cpp interleaves these Q/K rows
_GGUF_ARCH_LAYER = {
    "olmo2": {"post_attention_layernorm.weight": "post_attention_norm.weight",
              "post_feedforward_layernorm.weight": "post_ffw_norm.weight"},
    "phi3": {"self_attn.qkv_proj.weight": "attn_qkv.weight",
             "mlp.gate_up_proj.weight": "ffn_up.weight"},
}
_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias",
               "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight",
               "self_attn.o_proj.bias": "attn_output.bias",
               "mlp.gate_proj.bias": "ffn_gate.bias", "mlp.up_proj.bias": "ffn_up.bias",
               "mlp.down_proj.bias": "ffn_down.bias"}


def interleave_rotary_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Within each head, rows (i, i + d/2) become neighbours (2i, 2i + 1): the Q/K row order
    of llama GGUFs, whose RoPE rotates adjacent pairs."""
    d = weight.shape[0] // n_heads
    order = np.arange(d).reshape(2, d // 2).T.reshape(-1)  # 0, d/2, 1, d/2 + 1, ...
    heads = weight.reshape(n_heads, d, -1)[:, order]
    return heads.reshape(weight.shape)


def write_gguf(model, spec: TinySpec, path: Path) -> Path:
    """``model`` (from ``build_model``, a family of ``GGUF_ARCH``) as a float32 GGUF."""
    import gguf

    arch = GGUF_ARCH[spec.family]
    config = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(spec.layers)
    w.add_context_length(256)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    rope = config.rope_parameters
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_rope_dimension_count(spec.head_dim)
    if arch == "granite":
        w.add_embedding_scale(float(config.embedding_multiplier))
        w.add_residual_scale(float(config.residual_multiplier))
        w.add_attention_scale(float(config.attention_multiplier))
        w.add_logit_scale(float(config.logits_scaling))
    if arch == "phi3" and config.sliding_window is not None:
        w.add_sliding_window(int(config.sliding_window))
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    elif rope.get("rope_type") == "llama3":  # the per-frequency divisors, as a tensor
        from fixtures.llama_config import rope_inv_freq

        plain = rope_inv_freq(rope["rope_theta"], spec.head_dim)
        scaled = rope_inv_freq(rope["rope_theta"], spec.head_dim,
                               tuple(sorted(rope.items())))
        w.add_tensor("rope_freqs.weight", (plain / scaled).astype(np.float32))
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    for name, value in state.items():
        if name == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", value)
        elif name == "model.norm.weight":
            w.add_tensor("output_norm.weight", value)
        elif name == "lm_head.weight":
            if not spec.tied:
                w.add_tensor("output.weight", value)
        elif name.startswith("model.layers."):
            _, _, i, suffix = name.split(".", 3)
            if arch in PAIRWISE_ROPE and suffix.startswith(("self_attn.q_proj",
                                                            "self_attn.k_proj")):
                heads = spec.heads if "q_proj" in suffix else spec.kv_heads
                value = interleave_rotary_rows(value, heads)
            table = {**_GGUF_LAYER, **_GGUF_ARCH_LAYER.get(arch, {})}
            w.add_tensor(f"blk.{i}.{table[suffix]}", np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
