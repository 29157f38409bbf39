"""Every kernel's PTX before and after the kernels moved into ``.cu`` files: identical, or
the difference.

The old sources are the Python-string modules of a revision from before the move (they
rendered their CUDA text at import); the new ones are the ``.cu`` modules of this tree
(``engines/native/kernel_catalog.py``). Both are compiled to PTX for sm_90 with the options
the engine compiles them with (each module's own, plus the ``-ftz=true`` CuPy's RawModule
adds), optimised, by ``nvcc`` (no GPU needed) or by NVRTC through CuPy (what the engine
runs, on the GPU machine). Each old kernel (``gemv_rows_f16``) is paired with the template
instance its launcher now calls (``gemv_rows<lk_half>``), and the two ``.entry`` bodies are
compared with the kernel's own names normalised (its mangled name, which its parameters
carry, its local shared arrays' mangled names, the function's label numbering), each with
the module-level ``.global``/``.shared``/``.const`` declarations it uses.

Usage (repository root):
  python scripts/kernel_ptx_compare.py --old-rev dde0fbc              # nvcc, here
  python scripts/kernel_ptx_compare.py --old-rev dde0fbc --save-old build/ptx_old.json
  python3 scripts/kernel_ptx_compare.py --old build/ptx_old.json --compiler nvrtc --out $OUT
``--old-rev`` renders the old sources from ``git archive`` (needs the history); with
``--save-old`` it writes them to a file and stops (``build/`` is ignored: the device tool
carries it), for ``--old`` to read where there is no history (the GPU machine, where NVRTC
comes with CuPy). Prints a summary (and writes it, with every difference, under ``--out``);
exits 1 on any difference or unpaired kernel, 2 when it cannot compare at all. Kernels
rewritten on purpose after the move (``REWRITTEN``) are named in the summary, not compared.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's engines, not an installed copy
ARCH = "90"
CUPY_OPTIONS = ("-ftz=true",)  # what CuPy's RawModule adds to every module's options

# What the old tree rendered: each module's text, options and kernel names, by label.
_DUMP_OLD = r"""
import json, sys
from engines.native import batched_copy, bf16, cuda_kernels, fused_kernels
from engines.tensor_ops import cuda as ops
options = list(cuda_kernels.COMPILE_OPTIONS)
old = {
    "cuda_kernels": [cuda_kernels.KERNEL_SOURCE, options, list(cuda_kernels.KERNEL_NAMES)],
    "fused_kernels": [fused_kernels.FUSED_SOURCE, options, list(fused_kernels.FUSED_NAMES)],
    "casts": [bf16.cast_source(), options, list(bf16.CAST_KERNEL_NAMES)],
    "batched_copy": [batched_copy.SOURCE, [], [batched_copy.KERNEL_NAME]],
}
for name in ops._KERNEL_TYPES:
    old[f"argmax_{name}"] = [ops.kernel_source(name), [],
                             ["lockstep_argmax_rows", "lockstep_accept", "lockstep_keys"]]
json.dump({k: dict(zip(("text", "options", "names"), v)) for k, v in old.items()},
          sys.stdout)
"""
# kernels rewritten on purpose after the move (old name -> its successor, and where): not
# compared, named in the summary, and their successors' instances not reported as unpaired
REWRITTEN = {"lockstep_accept": ("lockstep_accept_rows",
                                "2007928: the accept's argmaxes and count in one launch"),
            "lockstep_argmax_rows": ("lockstep_argmax_rows",
                                     "2007928: its block reduction became lk_block_argmax, "
                                     "shared with the accept")}
# the old names' dtype suffixes
_SUFFIXES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
             "i32": "int32", "i64": "int64"}


class Unavailable(Exception):
    """The comparison cannot run (no compiler, no old source): exit 2, not a verdict."""


# -- the two sides -----------------------------------------------------------------------------
def old_sources(rev: str) -> dict:
    """The old modules of ``rev``, rendered by its own code (its ``engines/`` alone)."""
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "engines"],
                                 capture_output=True)
        if archive.returncode:
            raise Unavailable(f"git archive {rev}: {archive.stderr.decode()[-500:]}")
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        dump = subprocess.run([sys.executable, "-c", _DUMP_OLD], capture_output=True,
                              text=True, cwd=tree, env=dict(os.environ, PYTHONPATH=tree))
        if dump.returncode:
            raise Unavailable(f"rendering {rev}'s sources failed: {dump.stderr[-2000:]}")
        return json.loads(dump.stdout)


def new_modules() -> dict:
    """This tree's modules, grouped as the old ones were: label -> [CudaModule]."""
    from engines.native.kernel_catalog import cuda_modules

    modules = cuda_modules()
    grouped = {"cuda_kernels": [modules[n] for n in ("gemv", "bmm", "sum_axis")],
               "fused_kernels": [modules[n] for n in ("norm", "prologue_gemv", "swiglu",
                                                      "rotary", "kv_write", "attention")],
               "casts": [modules["cast"]], "batched_copy": [modules["batched_copy"]]}
    grouped.update({name: [m] for name, m in modules.items() if name.startswith("argmax_")})
    return grouped


def new_instance(label: str, old_name: str) -> str:
    """The instance of the new modules that the old kernel ``old_name`` became."""
    from engines.native.cupy_array_backend import TO_BF16, TO_FLOAT32
    from engines.native.kernel_source import instance

    if label == "casts":
        return {"lk_bf16_to_f32": TO_FLOAT32, "lk_f32_to_bf16": TO_BF16}[old_name]
    if label == "batched_copy":
        return old_name
    if label.startswith("argmax_"):
        return f"{old_name}<lk_argmax_{label.removeprefix('argmax_')}>"
    parts = old_name.split("_")
    dtypes = []
    while parts[-1] in _SUFFIXES:
        dtypes.insert(0, _SUFFIXES[parts.pop()])
    return instance("_".join(parts), *dtypes)


# -- compiling ---------------------------------------------------------------------------------
def compile_old(compiler: str, work: Path, text: str, options: list[str]) -> str:
    options = tuple(options) + CUPY_OPTIONS
    if compiler == "nvrtc":
        return nvrtc(text, options, ())[0]
    from suites.nvcc_check import compile_ptx

    return compile_ptx(text, f"sm_{ARCH}", work, options, optimise=True)


def compile_new(compiler: str, work: Path, module) -> tuple[str, dict[str, str]]:
    """(PTX, instance -> its entry's mangled name)."""
    if compiler == "nvrtc":
        return nvrtc(module.text(), module.compile_options() + CUPY_OPTIONS, module.instances)
    from suites.nvcc_check import compile_ptx, entry_instances

    ptx = compile_ptx(module.text() + module.instantiation(), f"sm_{ARCH}", work,
                      module.compile_options() + CUPY_OPTIONS, optimise=True)
    return ptx, entry_instances(ptx, module)


def nvrtc(text: str, options: tuple[str, ...], instances) -> tuple[str, dict[str, str]]:
    """NVRTC through CuPy, as RawModule calls it (CUPY_COMPILE_WITH_PTX: PTX, not a cubin)."""
    from cupy.cuda import compiler

    ptx, mapping = compiler.compile_using_nvrtc(text, options, arch=ARCH,
                                                name_expressions=list(instances) or None)
    return ptx.decode().rstrip("\0"), mapping or {}


# -- PTX ---------------------------------------------------------------------------------------
_ENTRY = re.compile(r"^\.(visible|weak) \.entry (\w+)\(", re.MULTILINE)
_DECL = re.compile(r"^(?:\.extern |\.visible |\.weak )*\.(?:global|shared|const) [^;]*?"
                   r"(\w+)(?:\[\d*\])?(?: = [^;]*)?;", re.MULTILINE)
_LABEL = re.compile(r"\$L__BB\d+_")  # a label's first number is its function's index
_LOCAL = re.compile(r"\b_ZZ\w+")


def entries(ptx: str) -> dict[str, tuple[str, str]]:
    """Each .entry's (linkage, text from its name to its closing brace)."""
    found = {}
    for match in _ENTRY.finditer(ptx):
        end = ptx.index("\n}\n", match.start()) + 3
        found[match.group(2)] = (match.group(1), ptx[match.start(2):end])
    return found


def declarations(ptx: str) -> dict[str, str]:
    """Module-level .global/.shared/.const declarations (outside every entry) by name."""
    outside, at = [], 0
    for match in _ENTRY.finditer(ptx):
        outside.append(ptx[at:match.start()])
        at = ptx.index("\n}\n", match.start()) + 3
    outside.append(ptx[at:])
    return {m.group(1): m.group(0) for m in _DECL.finditer("".join(outside))}


def _local(match: re.Match) -> str:
    """A function-local static's mangled name (_ZZ<function>E<length><name>) as its name."""
    symbol = match.group(0)
    for e in re.finditer(r"E(\d+)", symbol):
        if len(symbol) - e.end() == int(e.group(1)):
            return f"local.{symbol[e.end():]}"
    return symbol


def normalised(name: str, body: str, decls: dict[str, str]) -> str:
    """The entry with its own names replaced, and the declarations it uses after it."""
    used = [decls[s] for s in sorted(decls) if re.search(rf"\b{re.escape(s)}\b", body)]
    text = "\n".join([body.replace(name, "ENTRY")] + used)
    return _LOCAL.sub(_local, _LABEL.sub("$L__BB_", text))


def first_difference(a: str, b: str) -> str:
    old, new = a.split("\n"), b.split("\n")
    at = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))

    def line(lines: list[str]) -> str:
        return lines[at].strip() if at < len(lines) else "(the end)"

    return f"line {at + 1}: old {line(old)!r}, new {line(new)!r}"


# -- the comparison ----------------------------------------------------------------------------
def compare(old: dict, compiler: str, work: Path) -> tuple[list[str], list[str]]:
    """(summary lines, one line per difference)."""
    grouped = new_modules()
    jobs = [(label, None) for label in old] + [(label, m) for label in old
                                               for m in grouped[label]]

    def build(job):
        label, module = job
        if module is None:
            return compile_old(compiler, work, old[label]["text"], old[label]["options"]), {}
        return compile_new(compiler, work, module)

    with ThreadPoolExecutor(max_workers=min(8, len(os.sched_getaffinity(0)))) as pool:
        built = dict(zip(jobs, pool.map(build, jobs)))

    lines, details, total, same, relinked = [], [], 0, 0, 0
    for label, entry in old.items():
        old_ptx = built[(label, None)][0]
        old_entries, old_decls = entries(old_ptx), declarations(old_ptx)
        new = {}  # instance -> (linkage, normalised entry)
        for module in grouped[label]:
            ptx, lowered = built[(label, module)]
            bodies, decls = entries(ptx), declarations(ptx)
            new.update({inst: (bodies[name][0], normalised(name, bodies[name][1], decls))
                        for inst, name in lowered.items() if name in bodies})
        paired, identical = set(), 0
        replaced = [name for name in entry["names"] if name in REWRITTEN]
        for name in replaced:
            successor, why = REWRITTEN[name]
            paired.add(new_instance(label, successor))
            lines.append(f"{label}: {name} rewritten since the move as {successor} ({why}): "
                         f"not compared")
        for name in entry["names"]:
            if name in REWRITTEN:
                continue
            inst = new_instance(label, name)
            paired.add(inst)
            if name not in old_entries or inst not in new:
                side = "old" if name not in old_entries else "new"
                details.append(f"{label}: {name} -> {inst}: no entry in the {side} PTX")
                continue
            linkage, a = old_entries[name][0], normalised(name, old_entries[name][1], old_decls)
            relinked += linkage != new[inst][0]
            if a == new[inst][1]:
                identical += 1
            else:
                details.append(f"{label}: {name} -> {inst}: "
                               f"{first_difference(a, new[inst][1])}")
        unpaired = sorted(set(new) - paired)
        details += [f"{label}: {inst}: a new instance that no old kernel became"
                    for inst in unpaired]
        total += len(entry["names"]) - len(replaced)
        same += identical
        lines.append(f"{label}: {identical} of {len(entry['names']) - len(replaced)} kernels "
                     f"identical"
                     + (f", {len(unpaired)} new instances unpaired" if unpaired else ""))
    if relinked:
        lines.append(f"note: {relinked} entries changed linkage (.visible/.weak)")
    verdict = "IDENTICAL" if same == total and not details else "DIFFERENT"
    lines.append(f"{verdict}: {same} of {total} kernels' PTX identical "
                 f"({compiler}, sm_{ARCH}, optimised, the engine's options)")
    return lines, details


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--old-rev", help="a revision from before the move (git archive)")
    source.add_argument("--old", type=Path, help="the old sources, as --save-old wrote them")
    parser.add_argument("--save-old", type=Path, help="write the old sources here and stop")
    parser.add_argument("--compiler", choices=("nvcc", "nvrtc"), default="nvcc")
    parser.add_argument("--out", type=Path, help="write summary.txt and differences.txt here")
    parser.add_argument("--cache", type=Path, help="keep nvcc's PTX here between runs")
    args = parser.parse_args(argv)
    if args.compiler == "nvrtc":
        os.environ["CUPY_COMPILE_WITH_PTX"] = "1"  # read when CuPy's compiler is imported
    try:
        old = old_sources(args.old_rev) if args.old_rev else json.loads(args.old.read_text())
        if args.save_old:
            args.save_old.parent.mkdir(parents=True, exist_ok=True)
            args.save_old.write_text(json.dumps(old))
            print(f"the old sources of {len(old)} modules are in {args.save_old}")
            return 0
        with tempfile.TemporaryDirectory() as scratch:
            work = args.cache or Path(scratch)
            work.mkdir(parents=True, exist_ok=True)
            lines, details = compare(old, args.compiler, work)
    except (Unavailable, OSError, AssertionError, ImportError) as exc:
        print(f"kernel_ptx_compare: cannot compare: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines + details[:20]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
        (args.out / "differences.txt").write_text("".join(d + "\n" for d in details))
    return 0 if lines[-1].startswith("IDENTICAL") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
