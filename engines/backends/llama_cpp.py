"""``llama-cpp``: llama.cpp itself, through llama-cpp-python in process, on the GGUF file the
package was converted from.

What people ship is quantized, and llama.cpp is what runs most GGUF files. This engine puts
it under test as a black box: the GGUF named by the package's ``checkpoint.json`` is found
and hash-checked (``checkpoint_source``, as ``hf`` and ``ort-genai`` find theirs) and loaded
by llama.cpp's own loader; it decodes greedily with llama.cpp's own sampler
(``Llama.generate`` at temperature 0, repetition penalty 1.0, so the penalty sampler that
runs first changes nothing), and ``logits_all`` keeps llama.cpp's float32 logits for every
position it evaluates (``Llama.scores``), the rows the audit reads.

Three traps, each handled here: ``generate`` reuses a matching KV prefix from the previous
call even when told to reset, so ``reset()`` is called before every decode; the prompt ids
lockstep hands over are complete, and ``generate`` adds nothing to them (BOS is added only
by llama.cpp's tokenizer, which is never used); llama-cpp-python's default thread counts
follow the machine, so both are pinned (``threads``, ``$LOCKSTEP_LLAMA_THREADS``, default
1, as ``hf`` and ``ort-genai`` pin theirs): llama.cpp's results do not depend on them on the CPU (1 and 2 give the same bits), its
speed does (on two cores busy with other work, 1 thread decoded SmolLM2 some 30 times faster
than 2: ggml's threads wait for each other at every op).

Its numeric scheme (``ggml-cpu:q4_1`` for a Q4_1 GGUF: ggml's CPU kernels on the file's
dominant weight type, which also quantize the activations they meet) is read from the
GGUF's tensor types and stated in :meth:`LlamaCppEngine.provenance` with the build's
version and CPU features, so a verdict can tell which scheme's noise to expect.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engines.backends.checkpoint_source import (SIDECAR, find_checkpoint, read_source,
                                                require_gguf_source)
from engines.backends.llama_plain_buffers import plain_llama
from engines.decode_result import DecodeResult
from engines.engine import Availability, BlackBoxEngine
from engines.errors import EngineUnavailable, ExecutionError, InputError
from engines.gguf_header import field_value, tensor_table
from engines.requests import check_count, check_request

VERSION = "0.3.36"
INSTALL = (f"pip install -e '.[llama]' (llama-cpp-python=={VERSION}; pip compiles llama.cpp "
           f"with cmake, about 10 minutes on 2 cores, once per machine: make real does it)")
THREADS_ENV = "LOCKSTEP_LLAMA_THREADS"
DEFAULT_THREADS = 1
# GGUF tensor types that are plain floats: a file of only these has a float scheme
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True)
class BuildInfo:
    """The llama.cpp this process runs: llama-cpp-python's version, the vendored ggml's
    version and commit (``ggml_version``/``ggml_commit`` of its ``libggml-base``; None where
    the library does not export them), and llama.cpp's system info line (its backends and
    the CPU features the build uses)."""

    version: str
    ggml_version: str | None
    ggml_commit: str | None
    system_info: str

    def to_dict(self) -> dict[str, Any]:
        return {"llama_cpp_python": self.version, "ggml_version": self.ggml_version,
                "ggml_commit": self.ggml_commit, "system_info": self.system_info,
                "cpu_features": cpu_features(self.system_info)}


@functools.lru_cache(maxsize=1)
def build_info() -> BuildInfo:
    """This process's :class:`BuildInfo`. Imports llama_cpp, which loads the compiled
    library once."""
    import llama_cpp

    def ggml(symbol: str) -> str | None:
        try:
            lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
            fn = getattr(lib, symbol)
        except (OSError, AttributeError):
            return None
        fn.restype = ctypes.c_char_p
        return fn().decode()

    return BuildInfo(llama_cpp.__version__, ggml("ggml_version"), ggml("ggml_commit"),
                     llama_cpp.llama_print_system_info().decode().strip())


def cpu_features(system_info: str) -> list[str]:
    """The features the system info line marks ``= 1`` (``AVX512``, ``OPENMP``, ...)."""
    return re.findall(r"(\w+) = 1\b", system_info)


def gguf_scheme(path: Path) -> dict[str, Any]:
    """The numeric scheme a GGUF runs under on ggml's CPU backend: ``ggml-cpu:<type>``, the
    weight type holding the most elements (a quantized one where the file has any: the
    1-D norms stay F32 in every quantization), with every tensor type's count and the file's
    declared ``general.file_type``. Read from the header's walk (``tensor_table``); a file
    the walk cannot follow goes to the full reader, which says what is wrong with it."""
    import gguf

    table = tensor_table(path)
    if table is None:
        reader = gguf.GGUFReader(str(path))
        rows = [(t.name, int(t.tensor_type), int(t.n_elements)) for t in reader.tensors]
        declared = field_value(reader, "general.file_type")
    else:
        rows, declared = table.tensors, table.metadata.get("general.file_type")
    counts: Counter[str] = Counter()
    elements: Counter[str] = Counter()
    for _, kind, n in rows:
        name = gguf.GGMLQuantizationType(kind).name
        counts[name] += 1
        elements[name] += n
    quantized = {k: n for k, n in elements.items() if k not in FLOAT_TYPES}
    pool = quantized or elements
    dominant = max(sorted(pool), key=pool.__getitem__)
    file_type = None
    if declared is not None:
        try:
            file_type = gguf.LlamaFileType(int(declared)).name
        except ValueError:
            file_type = str(declared)
    return {"numeric_scheme": f"ggml-cpu:{dominant.lower()}",
            "tensor_types": dict(sorted(counts.items())), "gguf_file_type": file_type}


def resolve_threads(threads: int | None) -> int:
    """The thread count: the constructor's, else ``$LOCKSTEP_LLAMA_THREADS``, else 1."""
    remedy = f"give a thread count of at least 1, such as {DEFAULT_THREADS}"
    if threads is not None:
        return check_count(threads, "threads", remedy)
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return DEFAULT_THREADS
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{THREADS_ENV} is not an integer", field=THREADS_ENV, value=text,
                         remedy=f"set {THREADS_ENV} to a thread count such as "
                                f"{DEFAULT_THREADS}, or unset it") from None
    return check_count(value, THREADS_ENV, remedy)


class LlamaCppEngine(BlackBoxEngine):
    name = "llama-cpp"
    description = ("llama.cpp (llama-cpp-python, CPU) on the package's source GGUF, greedy "
                   "through its own sampler")
    residency = "host"
    logits_audit = True  # logits_all: llama.cpp's float32 row at every evaluated position
    # teacher_forced: the whole sequence in one eval (n_batch positions a decode), or one
    # position a decode (what each greedy step runs); llama.cpp gives every row either way,
    # and the two are not bit identical (its kernels depend on the batch's size)
    batch_shapes = (None, 1)

    @classmethod
    def check_settings(cls) -> None:
        resolve_threads(None)

    @classmethod
    def availability(cls) -> Availability:
        try:
            build = build_info()
        except ImportError as exc:
            return Availability(False, f"{exc.name or 'llama_cpp'} is not installed; {INSTALL}")
        except (OSError, RuntimeError) as exc:  # installed, its compiled library won't load
            return Availability(False, f"llama-cpp-python's library does not load ({exc}); "
                                       f"reinstall it: {INSTALL}")
        if importlib.util.find_spec("gguf") is None:  # reads the GGUF's tensor types
            return Availability(False, f"gguf is not installed; {INSTALL}")
        ggml = f", ggml {build.ggml_version} {build.ggml_commit}" if build.ggml_version else ""
        features = " ".join(cpu_features(build.system_info)) or "none reported"
        return Availability(True, f"llama-cpp-python {build.version}{ggml}, CPU features: "
                                  f"{features}")

    @classmethod
    def supports(cls, package) -> Availability:
        """Packages converted from a GGUF file (their ``checkpoint.json`` names it): llama.cpp
        runs that file; a fixture built from a seed has none."""
        source = read_source(package.root) or {}
        if not source.get("content_hash"):
            return Availability(False, f"{cls.name} runs the package's source GGUF; this "
                                       f"package has no {SIDECAR} naming one (a fixture built "
                                       f"from a seed)")
        if source.get("kind", "gguf") != "gguf":
            return Availability(False, f"{cls.name} runs GGUF files; this package was "
                                       f"converted from a {source.get('kind')!r} checkpoint")
        return Availability(True)

    def __init__(self, package, *, threads: int | None = None, n_batch: int = 512,
                 checkpoint=None):
        """``threads``: llama.cpp's threads for the prompt and for each step (default
        ``$LOCKSTEP_LLAMA_THREADS``, else 1). ``n_batch``: the most prompt positions one
        llama.cpp decode takes. ``checkpoint``: a ``CheckpointSource`` (default: the GGUF the
        package's ``checkpoint.json`` names, found and verified by ``checkpoint_source``)."""
        super().__init__(package)
        found = self.availability()
        if not found.ok:
            raise EngineUnavailable(found.reason, field="engine", value=self.name,
                                    remedy=INSTALL)
        self.threads = resolve_threads(threads)
        self.n_batch = int(n_batch)
        require_gguf_source(package, self.name, "runs GGUF files",
                            "convert the checkpoint to GGUF (llama.cpp's convert_hf_to_gguf.py) "
                            "and run lockstep convert on that file")
        if checkpoint is None:
            named = self.supports(package)  # the package must name its source GGUF
            if not named:
                raise EngineUnavailable(named.reason, field="package", value=str(package.root),
                                        remedy="run a package made by lockstep convert from a "
                                               "GGUF file")
        self.source = checkpoint or find_checkpoint(package.root, self.name)
        self.scheme = gguf_scheme(self.source.path)
        self.llama = plain_llama(str(self.source.path), **self.options())
        vocab = self.llama.n_vocab()
        if vocab != package.spec.vocab_size:
            raise ExecutionError(
                f"llama.cpp reads a vocabulary of {vocab} from {self.source.path.name}, the "
                f"package has {package.spec.vocab_size}: they were not made from one "
                f"checkpoint", field="vocab_size", value=vocab,
                remedy="run the package converted from this GGUF")

    def numeric_scheme(self) -> str:
        """``ggml-cpu:<type>``: the GGUF's dominant weight type on ggml's CPU kernels. The
        package was converted from this very GGUF, so it is the float32 model over the
        engine's own dequantized weights: the oracle that judges it needs no other."""
        return self.scheme["numeric_scheme"]

    def options(self) -> dict[str, Any]:
        """llama-cpp-python's ``Llama`` arguments: the package's context, float32 logits at
        every position, pinned threads, llama.cpp's defaults otherwise (f16 KV cache, no
        flash attention), quiet."""
        return {"n_ctx": self.package.spec.max_context, "n_batch": self.n_batch,
                "n_ubatch": self.n_batch, "n_threads": self.threads,
                "n_threads_batch": self.threads, "logits_all": True, "flash_attn": False,
                "n_gpu_layers": 0, "seed": 0, "verbose": False}

    def provenance(self) -> dict[str, Any]:
        """What ran: llama.cpp's build (version, system info, CPU features), the numeric
        scheme read from the GGUF, the settings, and the GGUF's path and content hash."""
        import gguf

        params = self.llama.context_params
        options = {k: v for k, v in self.options().items() if k != "verbose"}
        return {"runtime": "llama.cpp through llama-cpp-python, in process",
                **build_info().to_dict(), **self.scheme,
                "kv_cache": {"k": gguf.GGMLQuantizationType(int(params.type_k)).name,
                             "v": gguf.GGMLQuantizationType(int(params.type_v)).name},
                "options": options, "sampler": "greedy (temp 0), repeat_penalty 1.0",
                "logits": "float32, every evaluated position (logits_all)",
                "extra_buffer_types": "off: weights in plain CPU buffers (no repacking, no "
                                      "AMX; engines/backends/llama_plain_buffers.py)",
                "checkpoint": self.source.to_dict()}

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False) -> DecodeResult:
        """Greedy through llama.cpp's sampler, stopping after eos (unless ``ignore_eos``:
        then exactly ``max_new_tokens``). With ``audit``, the float32 row that decided each
        token (``scores`` at the position before it). Step times: the first covers the
        prompt's forward and its token."""
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        ledger = self.reset_ledger()
        eos = None if ignore_eos else self.package.spec.eos_id
        llama = self.llama
        llama.reset()  # generate would otherwise reuse the previous decode's matching prefix
        tokens: list[int] = []
        steps: list[float] = []
        start = mark = time.perf_counter()
        stream = llama.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in stream:
                now = time.perf_counter()
                steps.append(now - mark)
                mark = now
                tokens.append(int(token))
                if len(tokens) == max_new_tokens or tokens[-1] == eos:
                    break
        finally:
            stream.close()
        wall = time.perf_counter() - start
        rows = None
        if audit:
            first = len(ids) - 1
            rows = [np.array(llama.scores[first + i], dtype=np.float64)
                    for i in range(len(tokens))]
        for n, seconds in enumerate(steps):
            ledger.record_forward("prefill" if n == 0 else "decode",
                                  len(ids) if n == 0 else 1, seconds)
        return DecodeResult(self.name, ids, tokens, ledger, wall, steps, rows)

    def teacher_forced(self, ids, chunk: int | None = None) -> tuple[list[int], np.ndarray]:
        """llama.cpp's float32 rows at every position of ``ids`` from an empty cache, fed all
        at once (``chunk`` None: ``eval`` in pieces of ``n_batch``) or ``chunk`` positions a
        decode."""
        ids = [int(t) for t in ids]
        llama = self.llama
        llama.reset()
        step = len(ids) if chunk is None else int(chunk)
        for start in range(0, len(ids), step):
            llama.eval(ids[start:start + step])
        return list(range(len(ids))), np.array(llama.scores[:len(ids)], dtype=np.float32)

    def close(self) -> None:
        llama, self.llama = getattr(self, "llama", None), None
        if llama is not None:
            llama.close()


__all__ = ["BuildInfo", "LlamaCppEngine", "THREADS_ENV", "build_info", "cpu_features",
           "gguf_scheme", "resolve_threads"]
