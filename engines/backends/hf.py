"""``hf``: transformers' own LLaMA (or Qwen2) with the package's float32 weights.

The independent reference: none of lockstep's graph or executor code computes its logits.
It loads only packages converted from a checkpoint (``lockstep convert``), whose
``checkpoint.json`` names the architecture and each weight's ONNX initializer; the weights
are read back from the package itself, so transformers multiplies exactly the numbers the
other engines do. GGUF's ``llama`` Q/K rows were permuted for adjacent-pair RoPE; they are
permuted back (a reordering, no arithmetic) because transformers rotates halves.

It decodes itself: ``greedy(prompt, max_new_tokens)`` runs transformers' ``generate``
(greedy, its own KV cache) and returns a ``DecodeResult``; the runner calls it instead of
the workflow interpreter for any engine that has it. ``run_component`` serves the oracle:
a from-scratch forward over the whole prefix (fresh state only), returning logits and the
final hidden state.
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError

SIDECAR = "checkpoint.json"
_LLAMA = ("llama", "LlamaForCausalLM")
_QWEN2 = ("qwen2", "Qwen2ForCausalLM")
INSTALL = "pip install 'lockstep[hf]' (torch==2.13.0 CPU and transformers)"


def unpermute_pairs(w: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Rows laid out for adjacent-pair RoPE (2i, 2i+1) back to rotate-half order
    (i, i + head_dim/2), per head; ``w`` is [heads * head_dim, ...] or a bias vector."""
    rest = w.shape[1:]
    return (w.reshape(heads, head_dim // 2, 2, *rest).swapaxes(1, 2)
            .reshape(heads * head_dim, *rest))


class HfEngine(Engine):
    name = "hf"
    residency = "host"
    description = "transformers' LLaMA/Qwen2 (eager attention), greedy through generate"

    @classmethod
    def availability(cls) -> Availability:
        try:
            import torch
            import transformers
        except ImportError as exc:
            return Availability(False, f"{exc.name} is not installed; {INSTALL}")
        return Availability(True, f"transformers {transformers.__version__}, "
                                  f"torch {torch.__version__}")

    def __init__(self, package):
        super().__init__(package)
        import torch

        self._torch = torch
        # One intra-op thread, as ort-cpu: on a shared 2-core runner (pytest -n 2) torch's
        # OpenMP threads otherwise spin against each other, ten times slower. Process-wide.
        torch.set_num_threads(1)
        sidecar_path = package.root / SIDECAR
        if not sidecar_path.is_file():
            raise EngineUnavailable(
                f"hf runs packages converted from a checkpoint; {package.spec.name!r} has no "
                f"{SIDECAR}", field="package", value=str(package.root),
                remedy="convert a checkpoint with lockstep convert (fixtures built from seeds "
                       "have no transformers counterpart)")
        self.sidecar = json.loads(sidecar_path.read_text())
        self.dtype = {"float32": torch.float32, "float16": torch.float16}[package.spec.dtype]
        self.model = self._build_model()
        comp = package.spec.components["target"]
        self._ports = dict(comp.inputs), dict(comp.outputs)

    # -- loading -------------------------------------------------------------------------
    def _build_model(self):
        import transformers
        from onnx import numpy_helper

        torch = self._torch
        a = self.sidecar["architecture"]
        spec = self.package.spec
        family = a["family"]
        if family not in _LLAMA + _QWEN2:
            raise EngineUnavailable(f"hf has no model class for architecture {family!r}",
                                    field="architecture.family", value=family,
                                    remedy=f"use one of: {', '.join(_LLAMA + _QWEN2)}")
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
        config._attn_implementation = "eager"
        names = self.sidecar["weights"]["target"]
        inits = {t.name: t for t in self.package.component_model("target").graph.initializer}

        def get(key: str) -> np.ndarray:
            return numpy_helper.to_array(inits[names[key]])

        state = self._state_dict(get, a)
        torch.manual_seed(0)  # the random init is overwritten; seeded only to be repeatable
        model = cls(config).to(self.dtype)
        model.load_state_dict({k: torch.from_numpy(np.array(v, order="C")).to(self.dtype)
                               for k, v in state.items()}, strict=True)
        model.eval()
        model.generation_config.do_sample = False
        return model

    @staticmethod
    def _state_dict(get, a: dict) -> dict[str, np.ndarray]:
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

    # -- decoding ------------------------------------------------------------------------
    def greedy(self, prompt, max_new_tokens: int, audit: bool = False):
        """Greedy decoding by transformers' ``generate``; stops after emitting eos. With
        ``audit`` each step's raw logits row (``output_logits``) comes back too."""
        from engines.workflow import DecodeResult
        from engines.workflow.validation import check_request

        torch = self._torch
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        ledger = self.reset_ledger()
        eos = self.package.spec.eos_id
        stamps: list[float] = []

        class _Clock:  # generate's streamer hook: called with the prompt, then each token
            def put(self, value):
                stamps.append(time.perf_counter())

            def end(self):
                pass

        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids], dtype=torch.long),
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                eos_token_id=eos, pad_token_id=self.model.config.pad_token_id,
                streamer=_Clock(), use_cache=True, output_logits=audit,
                return_dict_in_generate=True)
        wall = time.perf_counter() - start
        rows = ([step[0].double().numpy() for step in out.logits] if audit else None)
        tokens = [int(t) for t in out.sequences[0, len(ids):].tolist()]
        steps = [b - a for a, b in zip([start] + stamps[1:], stamps[1:])]
        for n, seconds in enumerate(steps):
            ledger.record_forward("prefill" if n == 0 else "decode",
                                  len(ids) if n == 0 else 1, seconds)
        return DecodeResult(self.name, ids, tokens, ledger, wall, steps, rows)

    def run_component(self, component: str, feeds: dict[str, Any]) -> dict[str, Any]:
        """A from-scratch forward (what the oracle asks for): logits and the final hidden
        state over every fed position. A carried cache is refused: hf keeps its own."""
        torch = self._torch
        inputs, outputs = self._ports
        if component != "target":
            raise InputError(f"hf runs the target component only, not {component!r}",
                             field="component", value=component, remedy="use 'target'")
        ids = np.asarray(feeds[inputs["tokens"]])
        m = ids.shape[1]
        positions = feeds.get(inputs.get("positions", ""), np.arange(m).reshape(1, m))
        carried = [name for name, cell in self.package.spec.state_of("target").items()
                   if cell.update == "append" and np.asarray(feeds[cell.input]).shape[2] > 0]
        if carried or not np.array_equal(np.asarray(positions)[0], np.arange(m)):
            raise InputError("hf recomputes from scratch: positions must start at 0 with no "
                             "carried KV cache", field="feeds", value=carried or "positions",
                             remedy="decode through HfEngine.greedy (transformers' generate)")
        with torch.inference_mode():
            out = self.model(torch.from_numpy(ids.astype(np.int64)), use_cache=False,
                             output_hidden_states=True)
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float16
        result = {outputs["logits"]: out.logits.float().numpy().astype(np_dtype)}
        if "hidden" in outputs:
            result[outputs["hidden"]] = out.hidden_states[-1].float().numpy().astype(np_dtype)
        return result
