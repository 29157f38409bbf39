"""Kernel source variants timed side by side on one device (issue 12's bfloat16 gap): each
variant patches the kernels' .cu files as the modules read them (text substitutions that
must each match once in their file), and a fresh process per variant builds native-cuda on
every package, checks its greedy tokens, and the argmax of a VERIFY_ROWS-row verification,
against the first variant's (a variant may change speed, never a bit; an ablation, which
cuts a phase to see what it costs, changes bits and is not held to them), and times the
PRIMARY and VERIFY replays with CUDA events, the packages alternating.

Diagnostic only: what a change to the kernels buys before it lands; the figures issue 12 is
judged on come from ``lockstep bench``.

Usage (repo root, on a CUDA machine): python scripts/gpu_kernel_variants.py PACKAGE [...];
``python scripts/gpu_kernel_variants.py --random-smollm2 DIR`` first builds a random
SmolLM2-shaped float16 package at DIR (no checkpoint needed).
Environment: VARIANTS (comma list of names below, default all; "base" is the tree as it
is, "before" the kernels before run 17's bfloat16 changes, the others one change undone),
PDL_OFF (comma list of variants also timed with LOCKSTEP_DEPENDENT_LAUNCH=off), ROUNDS
(replay timings a package per variant, default 5), TOKENS (greedy tokens compared, default
32), VERIFY_ROWS (the verification's rows, default 8: the bench's W = 7). A timing is the
mean of 200 back-to-back replays (``harness.decode_profile.REPLAYS``).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUNDS = int(os.environ.get("ROUNDS", "5"))
TOKENS = int(os.environ.get("TOKENS", "32"))
VERIFY_ROWS = int(os.environ.get("VERIFY_ROWS", "8"))  # the bench's W = 7 verification

# The tree before the bfloat16 step was cut (run 17), as three undoings of it: the rounding
# in integers (not the hardware's cvt), rotary_kv_attention's keys and values converted
# through a reinterpreted pointer (not by words), and its staging loops left to unroll.
_HW_ROUND = """\
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : h;"""
_INT_ROUND = """\
    if ((u & 0x7fffffffu) > 0x7f800000u) return nan;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);"""
_K_WORDS = """\
                float kf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, TO());
#pragma unroll
                for (int e = 0; e < V; ++e) acc = __fmaf_rn(qs[c + e], kf[e], acc);"""
_K_POINTER = """\
                const lk_vec16 kv = *reinterpret_cast<const lk_vec16*>(kr + c);
                const TO* kp = reinterpret_cast<const TO*>(&kv);
#pragma unroll
                for (int e = 0; e < V; ++e) acc = __fmaf_rn(qs[c + e], lk_load(kp, e), acc);"""
_V_WORDS = """\
                float vf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(vh_old + j * D + c * V),
                                  vf, TO());
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vf[e];"""
_V_POINTER = """\
                const lk_vec16 vv = *reinterpret_cast<const lk_vec16*>(vh_old + j * D + c * V);
                const TO* vp = reinterpret_cast<const TO*>(&vv);
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * lk_load(vp, e);"""
_ROLLED = "#pragma unroll 1\n"
_Q_LOOP = _ROLLED + "    for (long long d = tid; d < D; d += blockDim.x) {\n        qs[d] ="
_NEW_LOOP = _ROLLED + "    for (long long i = tid; i < M * D; i += blockDim.x) {\n"

# name -> [(file of engines/native/kernels, text in the tree, text instead)]
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "base": [],
    "intround": [("prelude.cuh", _HW_ROUND, _INT_ROUND)],
    "pointer": [("attention.cu", _K_WORDS, _K_POINTER),  # rotary_kv_attention's
                ("attention.cu", _V_WORDS, _V_POINTER)],
    "unrolled": [("attention.cu", _Q_LOOP, _Q_LOOP[len(_ROLLED):]),
                 ("attention.cu", _NEW_LOOP, _NEW_LOOP[len(_ROLLED):])],
}
VARIANTS["before"] = VARIANTS["intround"] + VARIANTS["pointer"] + VARIANTS["unrolled"]
# Issue 37's two (0f3f77c), each undone: rotary_kv_attention without its old cache's L2
# prefetch; the one-row GEMV compiled with every row count's case (gemv_vec's 84 registers)
VARIANTS["nokvprefetch"] = [("attention.cu",
                             "    lk_kv_prefetch<TO>(old_k, old_v, Hq, M, C, D, group);\n", "")]
VARIANTS["vec1regs"] = [("gemv.cu", "    __shared__ float part[LK_GEMV_WARPS];\n",
                         "    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];\n"),
                        ("gemv.cu", "lk_gemv_vec_block<T, 1, true, LK_GEMV_WARPS",
                         "lk_gemv_vec_block<T, LK_GEMV_ROWS, true, LK_GEMV_WARPS")]
# rotary_kv_attention's key row and value runs loaded a batch of LK_RKA_RUNS at a time, and
# the row a slot was written by found by a subtraction over a run of positions (this
# session's, issue 37), undone: a load each, waited for before the next, and a search
_K_BATCH = """\
            // the key row in batches of LK_RKA_RUNS 16-byte runs, each batch's loads issued
            // before its first product: the same products in the same order
            const TO* kr = kh_old + j * D;
            for (long long c0 = 0; c0 < D; c0 += LK_RKA_RUNS * V) {
                lk_vec16 kv[LK_RKA_RUNS];
#pragma unroll
                for (int b = 0; b < LK_RKA_RUNS; ++b) {
                    if (c0 + b * V < D)
                        kv[b] = LK_RKA_PRELOAD_KEYS && j == tid && c0 == 0
                                    ? pre.k[b]
                                    : *reinterpret_cast<const lk_vec16*>(kr + c0 + b * V);
                }
#pragma unroll
                for (int b = 0; b < LK_RKA_RUNS; ++b) {
                    if (c0 + b * V < D) {
                        float kf[V];
                        lk_unpack16_words(kv[b], kf, TO());
#pragma unroll
                        for (int e = 0; e < V; ++e)
                            acc = __fmaf_rn(qs[c0 + b * V + e], kf[e], acc);
                    }
                }
            }
"""
_K_EACH = """\
            const TO* kr = kh_old + j * D;
#pragma unroll 4
            for (long long c = 0; c < D; c += V) {
""" + _K_WORDS + """
            }
"""
_V_BATCH = """\
        // keys j = g, g + groups, ... in batches of LK_RKA_RUNS: a batch's value runs are
        // loaded (a written slot's too, unused) before the first is added, then added in
        // order, so a thread waits on memory once a batch, not once a key
        for (long long j0 = g; j0 < L; j0 += LK_RKA_RUNS * (long long)groups) {
            lk_vec16 vv[LK_RKA_RUNS];
#pragma unroll
            for (int b = 0; b < LK_RKA_RUNS; ++b) {
                const long long j = j0 + b * (long long)groups;
                if (j < L)
                    vv[b] = LK_RKA_PRELOAD_VALUES && j0 == g
                                ? pre.v[b]
                                : *reinterpret_cast<const lk_vec16*>(vh_old + j * D + c * V);
            }
#pragma unroll
            for (int b = 0; b < LK_RKA_RUNS; ++b) {
                const long long j = j0 + b * (long long)groups;
                if (j < L) {
                    const long long hit = lk_written_row(spos, M, first, run, j);
                    const float pj = s[j];
                    if (hit >= 0) {
#pragma unroll
                        for (int e = 0; e < V; ++e)
                            o[e] = o[e] + pj * vnew[hit * D + c * V + e];
                    } else {
                        float vf[V];
                        lk_unpack16_words(vv[b], vf, TO());
#pragma unroll
                        for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vf[e];
                    }
                }
            }
        }
"""
_V_EACH = """\
#pragma unroll 2
        for (long long j = g; j < L; j += groups) {
            long long hit = -1;
            for (long long r = 0; r < M; ++r) if (spos[r] == j) hit = r;
            const float pj = s[j];
            if (hit >= 0) {
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vnew[hit * D + c * V + e];
            } else {
""" + _V_WORDS + """
            }
        }
"""
_HIT_RUN = "        const long long hit = lk_written_row(spos, M, first, run, j);\n        float acc"
_HIT_SEARCH = ("        long long hit = -1;\n"
               "        for (long long r = 0; r < M; ++r) if (spos[r] == j) hit = r;\n"
               "        float acc")
VARIANTS["loadeach"] = [("attention.cu", _K_BATCH, _K_EACH), ("attention.cu", _V_BATCH, _V_EACH),
                        ("attention.cu", _HIT_RUN, _HIT_SEARCH)]
# run 17's undoings find their text once this session's loads are undone
VARIANTS["pointer"] = VARIANTS["loadeach"] + VARIANTS["pointer"]
VARIANTS["before"] = VARIANTS["loadeach"] + VARIANTS["before"]
VARIANTS["before37"] = VARIANTS["nokvprefetch"] + VARIANTS["vec1regs"] + VARIANTS["loadeach"]
# 0f3f77c's two undone together, the batched loads kept (on the H200 before37 was 0.7192 ms
# and loadeach 0.7645 against base 0.7117: whether the two cost now what they saved then)
VARIANTS["no0f3f77c"] = VARIANTS["nokvprefetch"] + VARIANTS["vec1regs"]
# the attention's batches of 4 runs, not 8 (fewer registers, two round trips a key row)
VARIANTS["rka4"] = [("attention.cu", "#define LK_RKA_RUNS 8\n", "#define LK_RKA_RUNS 4\n")]
# weight runs in registers before the wait (issue 37, this stop) undone: in the one-row
# GEMV, in the GEMVs with a prologue, in both (their runs asked into L2 instead, as before)
_PRELOADS = "#define LK_GEMV_PRELOAD 4\n#define LK_PROLOGUE_PRELOAD 4\n"
VARIANTS["novec1preload"] = [("gemv_vec.cuh", _PRELOADS,
                               _PRELOADS.replace("GEMV_PRELOAD 4", "GEMV_PRELOAD 0"))]
VARIANTS["noprologuepreload"] = [("gemv_vec.cuh", _PRELOADS,
                                   _PRELOADS.replace("PROLOGUE_PRELOAD 4", "PROLOGUE_PRELOAD 0"))]
VARIANTS["nopreload"] = [("gemv_vec.cuh", _PRELOADS, _PRELOADS.replace(" 4\n", " 0\n"))]
# rotary_kv_attention's cache runs in registers before the wait (issue 37, 2026-12-05; off
# in the tree: slower on the H100): the key runs, the value runs, or both
_RKA = "#define LK_RKA_PRELOAD_KEYS 0\n#define LK_RKA_PRELOAD_VALUES 0\n"
VARIANTS["rkakeys"] = [("attention.cu", _RKA, _RKA.replace("KEYS 0", "KEYS 1"))]
VARIANTS["rkavalues"] = [("attention.cu", _RKA, _RKA.replace("VALUES 0", "VALUES 1"))]
VARIANTS["rkaboth"] = [("attention.cu", _RKA, _RKA.replace(" 0\n", " 1\n"))]
# Ablations (issue 37): rotary_kv_attention, the profile's largest kernel, with one phase
# cut, so the replays' difference is what that phase holds the step up by. The bits change,
# so their tokens are not compared (ABLATIONS); every output is still written, and finite,
# or the decode that captures the graphs would stop at a NaN row. cutcopy: the copying
# blocks store zeros (their old cache loads and the new rows' rotation cut); cutattention: the
# attention blocks store zeros at their wait; cutscores: every score is 0 (the key loads and
# products cut); cutsoftmax: the scores go to the value sum as they are; cutvalues: the
# value sum is 0 (its loads and sums cut).
_RKA_STORE = "        lk_rotary_kv_store<TX, TC, TO>(v, xk,"
_RKA_STAGE = "    __shared__ float qs[LK_RKA_MAX_D];\n"
_RKA_ZEROS = ("    if (C >= 0) {\n"
              "        for (long long d = threadIdx.x; d < D; d += blockDim.x)\n"
              "            lk_store(out, ((long long)blockIdx.x % M * Hq\n"
              "                           + (long long)blockIdx.x / M) * D + d, 0.0f);\n"
              "        return;\n"
              "    }\n")
_RKA_SCORE = "        float acc = 0.0f;\n        if (hit >= 0) {"
_RKA_SOFTMAX = "    lk_softmax_block(s, L, mx, smem, tid, O, SC);\n"
_RKA_VALUES = "        for (long long j0 = g; j0 < L; j0 += LK_RKA_RUNS * (long long)groups) {"
VARIANTS["cutcopy"] = [("attention.cu", _RKA_STORE, (
    "        if (C >= 0) {\n"
    "            const lk_vec16 zero = {{0u, 0u, 0u, 0u}};\n"
    "            if (v < runs_k) reinterpret_cast<lk_vec16*>(cache_k)[v] = zero;\n"
    "            else if (v - runs_k < runs_v)\n"
    "                reinterpret_cast<lk_vec16*>(cache_v)[v - runs_k] = zero;\n"
    "            return;\n"
    "        }\n") + _RKA_STORE)]
VARIANTS["cutattention"] = [("attention.cu", _RKA_STAGE, _RKA_ZEROS + _RKA_STAGE)]
VARIANTS["cutscores"] = [("attention.cu", _RKA_SCORE, _RKA_SCORE.replace(
    "if (hit >= 0)", "if (C >= 0) {\n        } else if (hit >= 0)"))]
VARIANTS["cutsoftmax"] = [("attention.cu", _RKA_SOFTMAX, "")]
VARIANTS["cutvalues"] = [("attention.cu", _RKA_VALUES,
                          _RKA_VALUES.replace("j0 < L;", "j0 < L && C < 0;"))]
# attention.cu's block trees finished by every thread (the same sums in the same order, so
# the same bits), not by thread 0 and read back after a third barrier: two barriers a tree,
# no thread alone in a loop (issue 37: the softmax holds a step up by 1.3 us a layer)
_TREE_SUM = """\
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < warps; ++w) total += smem[w];
        smem[32] = total;
    }
    __syncthreads();
    return smem[32];"""
_TREE_MAX = """\
    if (threadIdx.x == 0) {
        float m = smem[0];
        for (int w = 1; w < warps; ++w) m = fmaxf(m, smem[w]);
        smem[32] = m;
    }
    __syncthreads();
    return smem[32];"""
VARIANTS["treeall"] = [
    ("attention.cu", _TREE_SUM, "    float total = 0.0f;\n"
                                "    for (int w = 0; w < warps; ++w) total += smem[w];\n"
                                "    return total;"),
    ("attention.cu", _TREE_MAX, "    float m = smem[0];\n"
                                "    for (int w = 1; w < warps; ++w) m = fmaxf(m, smem[w]);\n"
                                "    return m;")]
ABLATIONS = frozenset(("cutcopy", "cutattention", "cutscores", "cutsoftmax", "cutvalues"))


def apply(name: str, assign=setattr) -> None:
    """Make every module read variant ``name``'s kernel files (``assign`` replaces
    ``engines.cuda_module.read_text``: a test passes its monkeypatch's, so the tree comes
    back)."""
    from engines import cuda_module
    from engines.native.kernel_source import KERNELS

    read, patched = cuda_module.read_text, {}
    for file, old, new in VARIANTS[name]:
        path = KERNELS / file
        text = patched.get(path) or read(path)
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: {file} does not hold the text it replaces "
                             "exactly once")
        patched[path] = text.replace(old, new)
    assign(cuda_module, "read_text", lambda path: patched.get(path) or read(path))


def _digest(ids) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


def verify_ids(engine, prompt: list[int]) -> list[int]:
    """A verification of VERIFY_ROWS tokens after ``prompt``'s prefill, run three times at
    the same position (eager, captured, replayed: the VERIFY slot then holds its graph); the
    last one's argmax a row."""
    from engines.workflow.session import DecodeSession

    session = DecodeSession(engine)
    session.forward(prompt, "prefill")
    start, fed = session.position, [prompt[i % len(prompt)] for i in range(VERIFY_ROWS)]
    for _ in range(3):
        session.position = start
        logits = session.forward(fed, "verify")["logits"]
    rows = logits.reshape(VERIFY_ROWS, logits.shape[-1])
    return list(engine.tensor_ops.argmax_rows(rows, VERIFY_ROWS))


def child(name: str, paths: list[str]) -> dict:
    """One variant in this process: tokens and PRIMARY and VERIFY replay timings per
    package."""
    apply(name)
    from engines.cuda_support import import_cupy
    from engines.native.graph_slots import GraphSlot
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode
    from harness.decode_profile import graph_replay_ms

    cp = import_cupy()
    engines, result = {}, {"variant": name, "pdl": os.environ.get("LOCKSTEP_DEPENDENT_LAUNCH",
                                                                  "on")}
    for path in paths:
        package = load_package(path)
        engine = get_engine_class("native-cuda")(package)
        prompt = list(package.spec.prompts[0])
        for _ in range(3):  # eager, recorded, replayed
            tokens = greedy_decode(engine, prompt, TOKENS, ignore_eos=True).tokens
        verified = verify_ids(engine, prompt)
        engine.synchronize()
        engines[path] = engine
        result[path] = {"tokens": _digest(tokens), "ms": [],
                        "verify_tokens": _digest(verified), "verify_ms": []}
    for _ in range(ROUNDS):
        for path, engine in engines.items():
            result[path]["ms"].append(graph_replay_ms(engine, cp))
            result[path]["verify_ms"].append(graph_replay_ms(engine, cp,
                                                             slot=GraphSlot.VERIFY))
    for engine in engines.values():
        engine.close()
    return result


def main(paths: list[str]) -> int:
    names = os.environ.get("VARIANTS", ",".join(VARIANTS)).split(",")
    pdl_off = set(filter(None, os.environ.get("PDL_OFF", "").split(",")))
    runs = [(n, "on") for n in names] + [(n, "off") for n in names if n in pdl_off]
    results = []
    for name, pdl in runs:
        env = dict(os.environ, LOCKSTEP_DEPENDENT_LAUNCH=pdl)
        done = subprocess.run([sys.executable, __file__, "--child", name, *paths], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{name} (pdl {pdl}) failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    if not results:
        return 1
    first = results[0]
    status = 0
    for slot, ms, ids in (("PRIMARY", "ms", "tokens"),
                          (f"VERIFY ({VERIFY_ROWS} rows)", "verify_ms", "verify_tokens")):
        print(f"\n{slot}\n{'variant':12} {'pdl':4} "
              + " ".join(f"{Path(p).name[-24:]:>26}" for p in paths)
              + "  ratio last/first package")
        for r in results:
            medians = [statistics.median(r[p][ms]) for p in paths]
            same = all(r[p][ids] == first[p][ids] for p in paths)
            cut = r["variant"] in ABLATIONS  # an ablation's bits are not the tree's
            status |= 0 if same or cut else 1
            print(f"{r['variant']:12} {r['pdl']:4} "
                  + " ".join(f"{m:>20.4f} ms   " for m in medians)
                  + f"  {medians[-1] / medians[0]:.3f}"
                  + ("" if same else "  ablation" if cut else "  TOKENS DIFFER"))
    return status


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--random-smollm2":  # gpu_round_probe's package
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from gpu_round_probe import shape_package

        print(shape_package(Path(sys.argv[2])))
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3:])))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
