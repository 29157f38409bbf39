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
    prompts: tuple[tuple[str, str], ...] = ()  # a quantized case's: (chat or plain, text)

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

# Two chat prompts (they start with BOS; the chat template adds its default system turn) and
# a plain one, 32 tokens: RoPE's base shows over the plain prompt's longer stream
QUANTIZED_PROMPTS = (("chat", "Hi"), ("chat", "Translate 'cat' to French."),
                     ("plain", "The first ten prime numbers are 2, 3, 5, 7,"))
# A dropped BOS acts only on a prompt that starts with it (SmolLM2's BOS is <|im_start|>: its
# chats do, its text does not) and fades within a few positions of it, while a decode is
# judged only after its prompt: after the two chats (31 and 38 tokens) int4 is 3-4x beyond its
# band, after 30 more chats of 18-43 tokens 0.5-17x (tenfold on 3, all of 18-19). So the BOS
# rows decode the two chats and a chat's opening, the first four tokens of every chat with the
# default system turn, whose steps lie next to the BOS (int4 33x, llama.cpp 13x; the openings
# of 3 to 14 tokens measured: int4 4-44x, 5 of 9 tenfold; llama.cpp 3-40x, 6 of 9)
BOS_PROMPTS = (*QUANTIZED_PROMPTS[:2], ("plain", "<|im_start|>system\nYou"))
QUANTIZED_TOKENS = 32


def _quantized(bug, status, step, prompts=QUANTIZED_PROMPTS):
    """A quantized engine (``harness.mutations``) on SmolLM2, over ``prompts``, judged by its
    scheme's checked-in band: a bug must be at least ten times beyond it on some metric (the
    farthest of the prompts); the honest engine passes on every prompt."""
    control = status in ("identical", "near-tie")
    return Case(bug, REAL, status, step, quantized=True, min_ratio=None if control else 10.0,
                prompts=prompts)


# quantized engines: llama-cpp on SmolLM2's own Q4_1 GGUF, onnxruntime-genai's int4 build
CASES += [
    _quantized(LlamaCppEngine, "identical", None),
    _quantized(qm.LlamaHalvesSwapped, "defect", 0),
    _quantized(qm.LlamaBlockScale, "drift", 0),
    _quantized(qm.LlamaRopeBase, "defect", 0),
    _quantized(qm.LlamaKvShift, "defect", qm.K),
    _quantized(qm.LlamaBosDropped, "defect", 0, BOS_PROMPTS),
    _quantized(OrtGenaiInt4Engine, "near-tie", None),
    _quantized(qm.Int4HalvesSwapped, "defect", 0),
    _quantized(qm.Int4RopeBase, "defect", 1),
    _quantized(qm.Int4BlockScale, "defect", 0),
    _quantized(qm.Int4BosDropped, "defect", 0, BOS_PROMPTS),
]

REAL_TOKENS = 12  # SmolLM2 rows: one prompt, a short stream (the oracle recomputes on CPU)
FIXTURE_TOKENS = 32
