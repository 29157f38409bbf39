"""The architectures the converter reads: one row per family, read by all that names them.

A row says what the family is called (its profile's ``family``: the name tests, errors and
GGUF's ``general.architecture`` use; ``title`` in prose), which Hugging Face class it reads
(``hf_class``, config.json's ``architectures[0]``) and how (``profile``, with its reader
function in ``hf_architectures``), whether and how it reads the family's GGUFs (``gguf``, from
``gguf_architectures``), what the graph models for it, which reduced dtypes are converted and
tested beside float32, and the tests that back it beyond the common ones.

Read by the converter (``hf_reader``, ``gguf_reader``), its refusals (``errors``), ``lockstep
convert --help``, docs/CONVERTER.md's table (``python -m harness.convert.architectures
docs/CONVERTER.md`` rewrites it; a test fails while it is stale) and the architecture tests
(``suites/test_architectures.py``). A new family that needs no new graph feature is a row
here, its reader function and its test (docs/CONVERTER.md says which files).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.convert.gguf_architectures import GRANITE, OLMO2, PHI3, GgufLayout
from harness.convert.hf_architectures import (GEMMA_FIELDS, GEMMA_LAYER, LLAMA_LAYER,
                                              MIXTRAL_LAYER, OLMO2_LAYER, PHI3_FUSED,
                                              PHI3_LAYER, QK_NORMS, QWEN_FIELDS, Profile,
                                              read_gemma2, read_gemma3, read_granite,
                                              read_llama, read_mistral, read_mixtral,
                                              read_olmo2, read_phi3, read_qwen2, read_qwen3)


@dataclass(frozen=True)
class Family:
    title: str  # as prose writes it
    hf_class: str  # config.json's architectures[0]
    profile: Profile  # how its Hugging Face checkpoints are read
    features: str  # what the graph models for it (docs/CONVERTER.md)
    gguf: GgufLayout | None = None  # read from GGUF too (general.architecture = its name)
    reduced: tuple[str, ...] = ("float16",)  # converted and tested beside float32
    tests: tuple[str, ...] = ()  # the tests that back it beyond the common ones

    @property
    def name(self) -> str:
        return self.profile.family


_GEMMA = dict(gemma_norms=True, tied_default=True, activation_field="hidden_activation",
              activation="gelu_pytorch_tanh")

FAMILIES: tuple[Family, ...] = (
    Family("Llama", "LlamaForCausalLM",
           Profile("llama", frozenset({"attention_bias", "mlp_bias", "pretraining_tp"}),
                   LLAMA_LAYER, read_llama),
           "GQA, tied or not, attention and MLP biases, RoPE `linear` / `llama3` from "
           "`rope_parameters` or `rope_scaling`",
           GgufLayout("pairs", note="Q4/Q5/Q8/F16/BF16 tensors, biases, RoPE `linear` from "
                                    "metadata, Llama 3 scaling from the `rope_freqs` tensor; "
                                    "float16 packages with either cache, bfloat16 dynamic"),
           reduced=("float16", "bfloat16"),
           tests=("suites/test_convert.py::test_converted_gguf_decodes_like_the_oracle",
                  "suites/test_convert.py::"
                  "test_static_cache_and_float16_variants_decode_the_same_stream",
                  "suites/test_convert.py::"
                  "test_reduced_graph_keeps_norms_softmax_rotary_and_residual_in_float32")),
    Family("Qwen2", "Qwen2ForCausalLM",
           Profile("qwen2", QWEN_FIELDS, LLAMA_LAYER, read_qwen2), "Q/K/V biases",
           GgufLayout("halves")),
    Family("Qwen3", "Qwen3ForCausalLM",
           Profile("qwen3", QWEN_FIELDS | {"attention_bias"}, {**LLAMA_LAYER, **QK_NORMS},
                   read_qwen3), "per-head q/k norms", GgufLayout("halves")),
    Family("Mistral", "MistralForCausalLM",
           Profile("mistral", frozenset({"sliding_window"}), LLAMA_LAYER, read_mistral),
           "sliding window as a mask",
           tests=("test_sliding_window_is_a_mask_that_only_matters_past_the_window",)),
    Family("Granite", "GraniteForCausalLM",
           Profile("granite", frozenset({"attention_bias", "mlp_bias", "pretraining_tp",
                                         "embedding_multiplier", "attention_multiplier",
                                         "residual_multiplier", "logits_scaling"}),
                   LLAMA_LAYER, read_granite),
           "embedding, attention, residual and logits multipliers", GRANITE),
    Family("OLMo2", "Olmo2ForCausalLM",
           Profile("olmo2", frozenset({"attention_bias"}), OLMO2_LAYER, read_olmo2),
           "post-norms, whole-projection q/k norms", OLMO2, reduced=("float16", "bfloat16")),
    Family("Phi3", "Phi3ForCausalLM",
           Profile("phi3", frozenset({"sliding_window"}), PHI3_LAYER, read_phi3,
                   fused=PHI3_FUSED),
           "fused qkv and gate/up, sliding window", PHI3),
    Family("Gemma2", "Gemma2ForCausalLM",
           Profile("gemma2", GEMMA_FIELDS, GEMMA_LAYER, read_gemma2, **_GEMMA),
           "embedding scale, sandwich norms, GELU-tanh gate, attention and final "
           "soft-capping, alternating sliding layers, query_pre_attn_scalar"),
    Family("Gemma3", "Gemma3ForCausalLM",
           Profile("gemma3", GEMMA_FIELDS | {"rope_local_base_freq"}, GEMMA_LAYER,
                   read_gemma3, local_rope=True, **_GEMMA),
           "Gemma2's plus per-head q/k norms, `layer_types`, the sliding layers' own RoPE "
           "base, linear scaling on full layers", reduced=("float16", "bfloat16"),
           tests=("test_a_vocabulary_past_65536_ids_converts_and_decodes",)),
    Family("Mixtral", "MixtralForCausalLM",
           Profile("mixtral", frozenset({"sliding_window", "num_local_experts",
                                         "num_experts_per_tok", "router_jitter_noise",
                                         "router_aux_loss_coef", "output_router_logits"}),
                   MIXTRAL_LAYER, read_mixtral,
                   expert_tensors={"w1.weight": "w_gate", "w3.weight": "w_up",
                                   "w2.weight": "w_down"},
                   expert_prefix="block_sparse_moe.experts."),
           "a sparse mixture of SwiGLU experts: the router's softmax, top "
           "`num_experts_per_tok` of `num_local_experts` by ONNX TopK, ties to the lowest "
           "expert index, weights renormalised; every expert computed for every token, so "
           "rows stay batch-invariant; sliding window",
           tests=("test_each_feature_matters[mixtral-experts_per_token]",
                  "test_router_ties_go_to_the_lowest_expert_index")),
)
BY_HF_CLASS = {f.hf_class: f for f in FAMILIES}
BY_NAME = {f.name: f for f in FAMILIES}
GGUF_FAMILIES = tuple(f.name for f in FAMILIES if f.gguf is not None)


def titles() -> str:
    """The families in prose: ``Llama, Qwen2, ...`` (``lockstep convert --help``)."""
    return ", ".join(f.title for f in FAMILIES)


# -- docs/CONVERTER.md's table ------------------------------------------------------------------

BEGIN = "<!-- the architecture table: python -m harness.convert.architectures docs/CONVERTER.md -->"
END = "<!-- end of the architecture table -->"


def markdown() -> str:
    """The docs' table, one row per family (test ids as the legend above it abbreviates them)."""
    rows = ["| family (what the graph models) | source | dtype | cache | tests |",
            "| --- | --- | --- | --- | --- |"]
    for f in FAMILIES:
        source = "HF" if f.gguf is None else \
            f"HF; GGUF{f' ({f.gguf.note})' if f.gguf.note else ''}"
        dtype = f"float32; {', '.join(f.reduced)}"
        tests = [f"`[{f.name}-*]`"] + ([f"`gguf[{f.name}-*]`"] if f.gguf else []) + \
            [f"`twin[{f.name}-{d}]`" for d in f.reduced] + [f"`{t}`" for t in f.tests]
        rows.append(f"| {f.title} ({f.features}) | {source} | {dtype} | float32: dynamic, "
                    f"static; reduced: dynamic | {', '.join(tests)} |")
    return "\n".join(rows)


def with_table(text: str) -> str:
    """``text`` (a docs page) with the block between ``BEGIN`` and ``END`` rewritten."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no architecture table block ({BEGIN} ... {END})")
    return pattern.sub(lambda _: f"{BEGIN}\n{markdown()}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.convert.architectures DOCS_PAGE``: rewrite the page's table."""
    parser = argparse.ArgumentParser(prog="python -m harness.convert.architectures",
                                     description="rewrite a docs page's architecture table")
    parser.add_argument("page", type=Path, help="the page (docs/CONVERTER.md)")
    page = parser.parse_args(argv).page
    try:
        page.write_text(with_table(page.read_text()))
    except (OSError, ValueError) as exc:
        parser.error(f"{page}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
