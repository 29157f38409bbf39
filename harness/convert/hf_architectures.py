"""What each Hugging Face decoder architecture means to the LLaMA graph.

One ``Profile`` per ``architectures[0]``: the config fields it reads (each becomes a graph
feature or is refused by value), its tensor names and how they map onto the graph's weight
keys. Every other config field must be bookkeeping (``is_bookkeeping``: names, versions,
dtypes, training-only settings, token ids the tokenizer owns, generation defaults), which
cannot change the computation: it is accepted and recorded in the package's
``checkpoint.json``. An unknown field refuses the checkpoint, so a variant the converter does
not model (Granite's multipliers under a Llama name, say) is never converted silently into a
different model.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.errors import InputError
from fixtures.llama_config import ROPE_SCALING_KEYS

# read by the converter besides COMMON and a profile's own fields
READ = frozenset({"architectures", "model_type", "bos_token_id", "eos_token_id",
                  "max_position_embeddings", "tie_word_embeddings"})
# fields that cannot change what a greedy forward computes
BOOKKEEPING = frozenset({
    # names, versions, the dtype weights were saved in, task labels
    "_name_or_path", "name_or_path", "_commit_hash", "transformers_version", "torch_dtype",
    "dtype", "use_bfloat16", "tokenizer_class", "id2label", "label2id", "num_labels",
    "problem_type", "finetuning_task", "task_specific_params", "prefix",
    "_attn_implementation_autoset",
    # remote code transformers runs only when trusted, never for an architecture it
    # implements itself (the reference the converter matches)
    "auto_map",
    # how transformers returns results and caches keys, and training-only settings
    "use_cache", "cache_implementation", "return_dict", "use_return_dict",
    "output_attentions", "output_hidden_states", "output_past", "torchscript",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "tie_encoder_decoder",
    "initializer_range", "attention_dropout", "embd_pdrop", "resid_pdrop", "hidden_dropout",
    "dropout", "gradient_checkpointing", "xla_device", "tf_legacy_loss",
    # the context a RoPE scaling was trained from, read only with a scaling that names it
    "original_max_position_embeddings",
    # read by other tools, ignored by transformers' own class for the architecture (the
    # reference the converter matches): SmolLM2's nanotron fields
    "is_llama_config", "rope_interleaved",
    # generation defaults older transformers kept in config.json (now generation_config.json):
    # they choose among the logits, lockstep compares the logits and decodes greedily
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "epsilon_cutoff",
    "eta_cutoff", "repetition_penalty", "encoder_repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})


def is_bookkeeping(name: str) -> bool:
    """A field that cannot change the computation: ``BOOKKEEPING``, or a token id the
    tokenizer owns (``unk_token_id``, ``sep_token_id``, ``forced_eos_token_id``, ...)."""
    return name in BOOKKEEPING or name.endswith(("_token_id", "_token_ids"))


def bookkeeping(config: dict) -> dict:
    """The bookkeeping fields ``config`` holds, for the package's provenance."""
    return {k: v for k, v in sorted(config.items()) if k not in READ and is_bookkeeping(k)}


# read by every profile
COMMON = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
    "rope_parameters", "rope_scaling", "partial_rotary_factor", "hidden_act",
})
_ATTN = {f"self_attn.{n}_proj.{kind}": f"{'w' if kind == 'weight' else 'b'}{n}"
         for n in "qkvo" for kind in ("weight", "bias")}
_MLP = {f"mlp.{n}_proj.{kind}": f"{'w' if kind == 'weight' else 'b'}_{n}"
        for n in ("gate", "up", "down") for kind in ("weight", "bias")}
LLAMA_LAYER = {"input_layernorm.weight": "attn_norm",
               "post_attention_layernorm.weight": "mlp_norm", **_ATTN, **_MLP}
QK_NORMS = {"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"}
OLMO2_LAYER = {"post_attention_layernorm.weight": "attn_post_norm",
               "post_feedforward_layernorm.weight": "mlp_post_norm", **_ATTN, **_MLP,
               **QK_NORMS}
GEMMA_LAYER = {"input_layernorm.weight": "attn_norm",
               "post_attention_layernorm.weight": "attn_post_norm",
               "pre_feedforward_layernorm.weight": "mlp_norm",
               "post_feedforward_layernorm.weight": "mlp_post_norm", **_ATTN, **_MLP, **QK_NORMS}
# Phi3's fused projections: split along the output rows into these keys
PHI3_FUSED = {"self_attn.qkv_proj.weight": ("wq", "wk", "wv"),
              "mlp.gate_up_proj.weight": ("w_gate", "w_up")}
NORM_KEYS = ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm", "q_norm", "k_norm",
             "final_norm")


def refuse(field_name: str, value, why: str, remedy: str, where: str) -> InputError:
    return InputError(f"config.json: {field_name} = {value!r}: {why}", field=field_name,
                      value=value, remedy=remedy, where=where)


@dataclass(frozen=True)
class Profile:
    family: str
    fields: frozenset  # architecture-specific config fields this profile reads
    layer_tensors: dict
    features: Callable[[dict, str], dict]  # config -> Architecture feature kwargs
    fused: dict = field(default_factory=dict)
    gemma_norms: bool = False  # gains stored as w, applied as (1 + w)
    tied_default: bool = False
    activation_field: str = "hidden_act"
    activation: str = "silu"  # the transformers activation name this profile models
    # a mixture of experts: "<prefix>{e}.<name>" -> "e{e}.<key>" for each name here
    expert_tensors: dict = field(default_factory=dict)
    expert_prefix: str = ""


def expert_key(suffix: str, profile: Profile) -> str | None:
    """The graph key of one expert's tensor (``block_sparse_moe.experts.3.w1.weight`` ->
    ``e3.w_gate``), or None."""
    if not suffix.startswith(profile.expert_prefix):
        return None
    index, _, name = suffix[len(profile.expert_prefix):].partition(".")
    part = profile.expert_tensors.get(name)
    return f"e{int(index)}.{part}" if index.isdigit() and part else None


def _flag(config: dict, name: str) -> bool:
    return bool(config.get(name) or False)


def _full_attention_only(config: dict, where: str) -> dict:
    """Qwen2/Qwen3: sliding windows only with use_sliding_window, which is refused."""
    if _flag(config, "use_sliding_window"):
        raise refuse("use_sliding_window", True, "Qwen's per-layer sliding window is not "
                     "modelled", "convert a checkpoint with use_sliding_window false", where)
    kinds = set(config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise refuse("layer_types", sorted(kinds), "only full attention is modelled for this "
                     "architecture", "convert a checkpoint whose layers all use full attention",
                     where)
    return {}


def _bias_all(config: dict) -> dict:
    on = _flag(config, "attention_bias")
    return {"attention_bias": on, "output_bias": on}


def _llama(config, where):
    if int(config.get("pretraining_tp") or 1) != 1:
        raise refuse("pretraining_tp", config["pretraining_tp"], "sliced projections are not "
                     "modelled", "set pretraining_tp to 1 (it only changes rounding)", where)
    return {**_bias_all(config), "mlp_bias": _flag(config, "mlp_bias")}


def _qwen2(config, where):
    return {**_full_attention_only(config, where), "attention_bias": True}


def _qwen3(config, where):
    return {**_full_attention_only(config, where), **_bias_all(config), "qk_norm": "head"}


def _window(config: dict, where: str) -> int | None:
    window = config.get("sliding_window")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise refuse("sliding_window", window, "a window is a positive number of keys",
                     "fix config.json", where)
    return window


def _mistral(config, where):
    return {"sliding_window": _window(config, where)}


def _phi3(config, where):
    return {"sliding_window": _window(config, where)}


def _mixtral(config, where):
    """Mixtral: Mistral's attention and a sparse mixture of SwiGLU experts, the router's
    top ``num_experts_per_tok`` of ``num_local_experts`` (its router jitter is training
    noise; aux-loss settings only add a training loss)."""
    experts, per_token = config.get("num_local_experts"), config.get("num_experts_per_tok")
    for name, value in (("num_local_experts", experts), ("num_experts_per_tok", per_token)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise refuse(name, value, "a mixture of experts needs a positive count here",
                         "fix config.json", where)
    if not (experts >= 2 and per_token <= experts):
        raise refuse("num_experts_per_tok", per_token, f"routes to more experts than the "
                     f"{experts} there are (or there is only one)",
                     f"use 1..{experts}, with at least two experts", where)
    return {"sliding_window": _window(config, where), "experts": experts,
            "experts_per_token": per_token}


def _granite(config, where):
    out = {**_llama(config, where)}
    for name, key in (("embedding_multiplier", "embed_scale"),
                      ("attention_multiplier", "attn_scale"),
                      ("residual_multiplier", "residual_scale"),
                      ("logits_scaling", "logits_divisor")):
        value = config.get(name)
        if value is None or not float(value) > 0:
            raise refuse(name, value, "Granite's multipliers are part of the model",
                         "give every multiplier a positive value", where)
        out[key] = float(value)
    return out


def _olmo2(config, where):
    return {**_bias_all(config), "qk_norm": "full", "norm_placement": "post"}


def _layer_windows(config: dict, where: str) -> dict:
    """Gemma: which layers slide, from ``layer_types`` (or the older sliding pattern)."""
    layers = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if types is None:
        pattern = int(config.get("sliding_window_pattern")
                      or config.get("_sliding_window_pattern") or 2)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(layers)]
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) != layers:
        raise refuse("layer_types", unknown or len(types), "each layer is sliding_attention "
                     "or full_attention", f"list {layers} layer types", where)
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = _window(config, where)
    if sliding and window is None:
        raise refuse("sliding_window", None, "layer_types names sliding layers",
                     "give the window's size", where)
    return {"sliding_window": window if sliding else None,
            "sliding_layers": sliding if sliding else None}


def _gemma2(config, where):
    if _flag(config, "use_bidirectional_attention"):
        raise refuse("use_bidirectional_attention", True, "the graph is causal",
                     "convert a causal (decoder) checkpoint", where)
    hidden = int(config["hidden_size"])
    out = {**_bias_all(config), **_layer_windows(config, where), "norm_placement": "sandwich",
           "embed_scale": math.sqrt(hidden),
           "attn_scale": float(config.get("query_pre_attn_scalar") or 256) ** -0.5}
    for name, key in (("attn_logit_softcapping", "attn_softcap"),
                      ("final_logit_softcapping", "final_softcap")):
        value = config.get(name)
        if value is not None:
            out[key] = float(value)
    return out


def _gemma3(config, where):
    return {**_gemma2(config, where), "qk_norm": "head"}


_GEMMA_FIELDS = frozenset({"attention_bias", "query_pre_attn_scalar", "attn_logit_softcapping",
                           "final_logit_softcapping", "sliding_window", "layer_types",
                           "hidden_activation", "use_bidirectional_attention",
                           "sliding_window_pattern", "_sliding_window_pattern"})
_QWEN_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers",
                          "layer_types"})
PROFILES = {
    "LlamaForCausalLM": Profile("llama", frozenset({"attention_bias", "mlp_bias",
                                                    "pretraining_tp"}), LLAMA_LAYER, _llama),
    "Qwen2ForCausalLM": Profile("qwen2", _QWEN_FIELDS, LLAMA_LAYER, _qwen2),
    "Qwen3ForCausalLM": Profile("qwen3", _QWEN_FIELDS | {"attention_bias"},
                                {**LLAMA_LAYER, **QK_NORMS}, _qwen3),
    "MistralForCausalLM": Profile("mistral", frozenset({"sliding_window"}), LLAMA_LAYER,
                                  _mistral),
    "GraniteForCausalLM": Profile("granite", frozenset({
        "attention_bias", "mlp_bias", "pretraining_tp", "embedding_multiplier",
        "attention_multiplier", "residual_multiplier", "logits_scaling"}), LLAMA_LAYER,
        _granite),
    "Olmo2ForCausalLM": Profile("olmo2", frozenset({"attention_bias"}), OLMO2_LAYER, _olmo2),
    "MixtralForCausalLM": Profile(
        "mixtral", frozenset({"sliding_window", "num_local_experts", "num_experts_per_tok",
                              "router_jitter_noise", "router_aux_loss_coef",
                              "output_router_logits"}),
        {"input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
         **{k: v for k, v in _ATTN.items() if k.endswith("weight")},
         "block_sparse_moe.gate.weight": "router"}, _mixtral,
        expert_tensors={"w1.weight": "w_gate", "w3.weight": "w_up", "w2.weight": "w_down"},
        expert_prefix="block_sparse_moe.experts."),
    "Phi3ForCausalLM": Profile("phi3", frozenset({"sliding_window"}), {
        "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
        "self_attn.o_proj.weight": "wo", "mlp.down_proj.weight": "w_down"}, _phi3,
        fused=PHI3_FUSED),
    "Gemma2ForCausalLM": Profile("gemma2", _GEMMA_FIELDS, GEMMA_LAYER, _gemma2,
                                 gemma_norms=True, tied_default=True,
                                 activation_field="hidden_activation",
                                 activation="gelu_pytorch_tanh"),
    "Gemma3ForCausalLM": Profile("gemma3", _GEMMA_FIELDS | {"rope_local_base_freq"},
                                 GEMMA_LAYER, _gemma3,
                                 gemma_norms=True, tied_default=True,
                                 activation_field="hidden_activation",
                                 activation="gelu_pytorch_tanh"),
}
SUPPORTED = tuple(PROFILES)


def check_fields(config: dict, profile: Profile, where: str) -> None:
    """Refuse any config field that is neither read for ``profile`` nor bookkeeping."""
    read = READ | COMMON | profile.fields
    for name in sorted(config):
        if name not in read and not is_bookkeeping(name):
            raise refuse(name, config[name], f"lockstep does not know what this field does to "
                         f"a {profile.family} model, so converting would risk building a "
                         f"different model", "convert a checkpoint without it, or teach "
                         "harness/convert/hf_architectures.py what it means", where)


def check_activation(config: dict, profile: Profile, where: str) -> str:
    names = [n for n in (profile.activation_field, "hidden_act") if config.get(n) is not None]
    for name in names:
        if config[name] != profile.activation:
            raise refuse(name, config[name], f"the {profile.family} graph's gate activation is "
                         f"{profile.activation}", f"convert a checkpoint whose {name} is "
                         f"{profile.activation}", where)
    return "gelu_tanh" if profile.activation == "gelu_pytorch_tanh" else "silu"


def rope(config: dict, where: str, profile: Profile) -> tuple[float, tuple | None, float | None]:
    """(base, scaling pairs or None, the sliding layers' own base or None) from
    ``rope_parameters`` (transformers 5; per layer type for Gemma3) or the older
    ``rope_theta`` + ``rope_scaling`` (+ Gemma3's ``rope_local_base_freq``)."""
    params = config.get("rope_parameters") or {}
    local = None
    if profile.family == "gemma3":
        local = float(config.get("rope_local_base_freq") or 10000.0)
        if "full_attention" in params or "sliding_attention" in params:
            local_params = params.get("sliding_attention") or {}
            local, local_scaling = _scaling(local_params, "rope_parameters.sliding_attention",
                                            where, default_base=local)
            if local_scaling is not None:
                raise refuse("rope_parameters.sliding_attention", local_params, "RoPE scaling "
                             "on the sliding layers is not modelled", "convert a checkpoint "
                             "whose sliding layers use plain RoPE", where)
            params = params.get("full_attention") or {}
    merged = {**params}
    legacy = config.get("rope_scaling")
    if legacy:
        merged.update({("rope_type" if k == "type" else k): v for k, v in legacy.items()})
    merged.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("partial_rotary_factor") is not None:
        merged.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    base, scaling = _scaling(merged, "rope_scaling" if legacy else "rope_parameters", where)
    if local is not None and local == base and scaling is None:
        local = None  # the same table
    return base, scaling, local


def _scaling(params: dict, where_field: str, where: str,
             default_base: float = 10000.0) -> tuple[float, tuple | None]:
    params = dict(params)
    base = float(params.pop("rope_theta", default_base))
    partial = params.pop("partial_rotary_factor", 1.0)
    if float(partial) != 1.0:
        raise refuse(f"{where_field}.partial_rotary_factor", partial, "partial rotary "
                     "embedding is not modelled", "convert a checkpoint that rotates every "
                     "head channel", where)
    kind = params.pop("rope_type", "default") or "default"
    if kind == "default":
        required = ()
    elif kind in ROPE_SCALING_KEYS:
        required = ROPE_SCALING_KEYS[kind]
    else:
        raise refuse(f"{where_field}.rope_type", kind, "this RoPE scaling is not modelled",
                     f"convert a checkpoint with rope_type default, "
                     f"{' or '.join(ROPE_SCALING_KEYS)}", where)
    missing = [k for k in required if params.get(k) is None]
    extra = sorted(set(params) - set(required))
    if missing or extra:
        name = missing[0] if missing else extra[0]
        raise refuse(f"{where_field}.{name}", params.get(name), f"rope_type {kind} reads "
                     f"exactly {', '.join(required) or 'no parameters'}", "convert a "
                     "checkpoint whose RoPE parameters lockstep models", where)
    if kind == "default":
        return base, None
    return base, (("rope_type", kind),
                  *sorted((k, float(params[k])) for k in required))
