"""The catch matrix's rows: each planted bug, where it is run, and the verdict and step it
must get. ``step`` is the first step at which anything is found (a token, a logits row, an
error), the lowest over the package's prompts; it is where the bug strikes by construction:
K for a bug in step K's own forward or token, K+1 for state written wrong at step K (the
next forward reads it)."""
from __future__ import annotations

from dataclasses import dataclass

from engines.backends.llama_cpp import LlamaCppEngine
from engines.backends.ort_genai import OrtGenaiInt4Engine
from harness import mutations as qm
from suites.planted import engines as pe
from suites.planted.engines import K

REAL = "smollm2"


@dataclass(frozen=True)
class Case:
    bug: type
    package: str
    status: str
    step: int | None  # None: no step (constructor, budgets, identical)
    mode: str = "greedy"
    width: int | None = None
    min_ratio: float | None = None  # a quantized bug: this many times beyond its band at least
    quantized: bool = False  # a quantized engine's case: judged by its scheme's band

    @property
    def id(self) -> str:
        return f"{self.bug.name.removeprefix('planted-')}-{self.package}-{self.mode}"

    @property
    def control(self) -> bool:
        return self.status in ("identical", "near-tie")


def _greedy(bug, status, step, packages):
    return [Case(pe.on_ort(bug) if p == REAL else bug, p, status, step) for p in packages]


FIXTURES = ("tiny_llama", "tiny_llama_static", "tied_llama", "hybrid_mtp")

CASES: list[Case] = [
    # controls: harmless changes must never be flagged
    *_greedy(pe.Control, "identical", None, FIXTURES + ("lookup_chained", REAL)),
    *_greedy(pe.SimulatedDevice, "identical", None, ("tiny_llama",)),
    Case(pe.Control, "tiny_llama_pair", "identical", None, "speculative", 2),
    Case(pe.Control, "hybrid_mtp", "identical", None, "speculative", 2),
    # state and position bugs inside the forward
    *_greedy(pe.KvDropAppend, "defect", K + 1, ("tiny_llama", "tied_llama", "hybrid_mtp")),
    *_greedy(pe.PositionOffByOne, "defect", K, FIXTURES),
    # on SmolLM2's 8-token answer neither flips a token: the logits audit catches them
    *_greedy(pe.KvDropAppend, "drift", K + 1, (REAL,)),
    *_greedy(pe.PositionOffByOne, "drift", K, (REAL,)),
    *_greedy(pe.RecurrentStateLost, "defect", K, ("hybrid_mtp",)),
    *_greedy(pe.StaleStaticSlot, "defect", K + 1, ("tiny_llama_static",)),
    # a fused kernel's bug: the prefill's own forward already reads the extra slot
    *_greedy(pe.FusedAttentionExtraSlot, "defect", 0, ("tiny_llama", "tiny_llama_static")),
    *_greedy(pe.PrefillWrongRow, "defect", 0, ("tiny_llama", "tied_llama", "lookup_chained", REAL)),
    # logits bugs
    *_greedy(pe.LogitsFloat16, "drift", 0, ("tiny_llama", "tied_llama", REAL)),
    *_greedy(pe.NanPartialRow, "non-finite", 0, ("tiny_llama", "tied_llama", REAL)),
    *_greedy(pe.NanRow, "non-finite", K, ("tiny_llama", "hybrid_mtp")),
    # token choice bugs
    *_greedy(pe.LastIndexTies, "defect", 0, ("tied_llama",)),
    *_greedy(pe.TokenSwap, "defect", K, ("tiny_llama", "tied_llama", REAL)),
    *_greedy(pe.EarlyStop, "defect", K, ("tiny_llama", "tied_llama")),
    # failures become error cells, with their step
    *_greedy(pe.RaiseMidDecode, "error", K, ("tiny_llama", REAL)),
    *_greedy(pe.ConstructorFails, "error", None, ("tiny_llama",)),
    *_greedy(pe.WrongStateShape, "error", K, ("tiny_llama", "hybrid_mtp")),
    # device budgets, on a simulated device (the real ones run in the GPU suite)
    *_greedy(pe.SimulatedDeviceStaging, "budget", None, ("tiny_llama",)),
    *_greedy(pe.SimulatedExtraReadback, "budget", None, ("tiny_llama",)),
    # speculative paths
    Case(pe.VerifyRowShift, "tiny_llama_pair", "defect", 1, "speculative", 2),
    Case(pe.VerifyRowShift, "hybrid_mtp", "defect", 1, "speculative", 2),
    # only a verification's rows are wrong, every token right: the audit of every row that
    # decides a token (the verification rows included) catches them at the first one
    Case(pe.VerifyLogitsFloat16, "tiny_llama_pair", "drift", 1, "speculative", 2),
    Case(pe.VerifyLogitsFloat16, "hybrid_mtp", "drift", 1, "speculative", 2),
    Case(pe.VerifyNanPartialRow, "tiny_llama_pair", "non-finite", 1, "speculative", 2),
    Case(pe.VerifyNanPartialRow, "hybrid_mtp", "non-finite", 1, "speculative", 2),
    Case(pe.GreedyOnlyPosition, "tiny_llama_pair", "defect", K + 1, "speculative", 2),
    Case(pe.RollbackNoTruncate, "tiny_llama_pair", "error", -1, "speculative", 2),
]
# step -1: after the first partial accept of a correct engine (the suite computes it)

def _quantized(bug, status, step, min_ratio: float | None = 10.0):
    """A quantized engine (``harness.mutations``) on SmolLM2, over ``QUANTIZED_PROMPTS``,
    judged by its scheme's checked-in band: a bug must be at least ``min_ratio`` times beyond
    it on some metric (the farthest of the prompts); the honest engine passes on every
    prompt."""
    return Case(bug, REAL, status, step, quantized=True,
                min_ratio=None if status in ("identical", "near-tie") else min_ratio)


# quantized engines: llama-cpp on SmolLM2's own Q4_1 GGUF, onnxruntime-genai's int4 build
CASES += [
    _quantized(LlamaCppEngine, "identical", None),
    _quantized(qm.LlamaHalvesSwapped, "defect", 0),
    _quantized(qm.LlamaBlockScale, "drift", 0),
    _quantized(qm.LlamaRopeBase, "defect", 0),
    _quantized(qm.LlamaKvShift, "defect", qm.K),
    # the answer's first token is still the oracle's: the missing BOS shows from the second
    _quantized(qm.LlamaBosDropped, "defect", 1),
    _quantized(OrtGenaiInt4Engine, "near-tie", None),
    _quantized(qm.Int4HalvesSwapped, "defect", 0),
    _quantized(qm.Int4RopeBase, "defect", 1),
    # caught (drift), but in these 32-token decodes within 10x of the int4 band (6x, 4x): on
    # the calibration corpus they are 92x and 41x beyond it (docs/QUANTIZED.md)
    _quantized(qm.Int4BlockScale, "drift", 1, min_ratio=None),
    _quantized(qm.Int4BosDropped, "drift", 0, min_ratio=None),
]

# Two chat prompts (they start with BOS; the chat template adds its default system turn) and
# a plain one, 32 tokens: RoPE's base shows over the plain prompt's longer stream, a dropped
# BOS in the chat answers' first steps
QUANTIZED_PROMPTS = (("chat", "Hi"), ("chat", "Translate 'cat' to French."),
                     ("plain", "The first ten prime numbers are 2, 3, 5, 7,"))
QUANTIZED_TOKENS = 32

REAL_TOKENS = 12  # SmolLM2 rows: one prompt, a short stream (the oracle recomputes on CPU)
FIXTURE_TOKENS = 32
