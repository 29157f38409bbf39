"""``ort-genai`` and ``ort-genai-cuda``: onnxruntime-genai as a black box.

An outside engine judged as a user would judge it: its model is what onnxruntime-genai's own
builder makes from the checkpoint the package was converted from (``genai_build``), not
lockstep's ONNX graph; only the checkpoint is shared. It decodes greedily through the
generator API (``Generator.append_tokens`` / ``generate_next_token``), each step's logits
from ``Generator.get_logits()`` (the raw rows, before search processing); ``ignore_eos``
sets ``min_length`` so exactly ``max_new_tokens`` come back. The oracle judges it on the
package it was handed (lockstep's conversion of the same weights): the cell's judgement
names that package, and :meth:`provenance` names the build this engine ran (builder,
version, precision, checkpoint hash).

Precision: the CPU engine builds ``-e cpu -p fp32`` for a float32 package; the CUDA engine
builds ``-e cuda`` in the package's dtype (fp16, bf16). onnxruntime-genai 0.18's float32
CUDA builds do not load, so a float32 package is ``unavailable`` there, with that reason.
"""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import time
from typing import Any, ClassVar

import numpy as np
import onnxruntime

from engines.backends import genai_build
from engines.backends.checkpoint_source import SIDECAR, find_checkpoint, read_source
from engines.backends.genai_dequant import build_scheme, dequantized_package_for
from engines.decode_result import DecodeResult
from engines.engine import Availability, BlackBoxEngine
from engines.errors import EngineUnavailable, ExecutionError
from engines.requests import check_request

INSTALL_CUDA = ("pip install --no-deps onnxruntime-genai-cuda onnxruntime-gpu (CUDA 13 "
                "builds, on a machine with a GPU; scripts/gpu_genai.sh installs them from "
                ".whl/), and the builder's needs: onnx-ir, torch, transformers, gguf")


class OrtGenaiEngine(BlackBoxEngine):
    name = "ort-genai"
    description = ("onnxruntime-genai's generator over the model its own builder makes from "
                   "the package's checkpoint (CPU, fp32)")
    residency = "host"
    logits_audit = True  # Generator.get_logits(), each step's raw row
    #: the builder's -e
    provider: ClassVar[str] = "cpu"
    #: package dtype -> the builder's -p (a dtype not listed is unavailable)
    precisions: ClassVar[dict[str, str]] = {"float32": "fp32"}
    #: session options laid over the build's genai_config.json (``Config.overlay``): one
    #: thread on the CPU, as ort-cpu and hf (on a shared 2-core runner more fight each other)
    session_options: ClassVar[dict[str, Any]] = {"intra_op_num_threads": 1}
    # teacher_forced: one position an append (every row), or 8 (the row after each piece:
    # get_logits() holds only the last position's)
    batch_shapes = (1, 8)

    @classmethod
    def availability(cls) -> Availability:
        version = genai_build.genai_version()
        if version is None or importlib.util.find_spec("onnxruntime_genai") is None:
            return Availability(False, f"onnxruntime-genai is not installed; "
                                       f"{genai_build.INSTALL}")
        missing = genai_build.missing_builder_modules()
        if missing:
            return Availability(False, f"onnxruntime-genai {version} is installed but its model "
                                       f"builder needs {', '.join(missing)}; "
                                       f"{genai_build.INSTALL}")
        return Availability(True, f"onnxruntime-genai {version}, its builder with -e "
                                  f"{cls.provider}")

    def __init__(self, package, *, checkpoint=None):
        """``checkpoint``: a ``CheckpointSource`` to build from (default: the one the
        package's ``checkpoint.json`` names, found by ``checkpoint_source``)."""
        super().__init__(package)
        dtype = package.spec.dtype
        precision = self.precisions.get(dtype)
        if precision is None:
            raise EngineUnavailable(
                self._precision_refusal(dtype), field="dtype", value=dtype,
                remedy=f"run a {' or '.join(self.precisions)} conversion "
                       f"(lockstep convert CHECKPOINT --dtype {next(iter(self.precisions))})")
        found = self.availability()
        if not found.ok:
            raise EngineUnavailable(found.reason, field="engine", value=self.name,
                                    remedy=genai_build.INSTALL)
        if checkpoint is None:
            named = self.supports(package)  # the package must name its source checkpoint
            if not named:
                raise EngineUnavailable(named.reason, field="package", value=str(package.root),
                                        remedy="run a package made by lockstep convert from a "
                                               "GGUF file or a Hugging Face folder")
        self.checkpoint = checkpoint or find_checkpoint(package.root, self.name)
        self.build = genai_build.ensure_build(self.checkpoint, precision, self.provider)
        import onnxruntime_genai as og

        self._og = og
        self.model = self.open_model(self.build.folder)
        vocab = json.loads((self.build.folder / "genai_config.json").read_text())["model"].get(
            "vocab_size")
        if vocab is not None and int(vocab) != package.spec.vocab_size:
            raise ExecutionError(
                f"the {self.name} build has vocab_size {vocab}, the package "
                f"{package.spec.vocab_size}: they were not made from one checkpoint",
                field="vocab_size", value=vocab,
                remedy="run the package converted from the same checkpoint")

    def open_model(self, folder):
        """onnxruntime-genai's model of the build in ``folder``, with this engine's session
        options laid over its ``genai_config.json``."""
        og = self._og
        config = og.Config(str(folder))
        if self.session_options:  # runtime settings over the builder's genai_config.json
            config.overlay(json.dumps({"model": {"decoder": {
                "session_options": dict(self.session_options)}}}))
        return og.Model(config)

    @classmethod
    def supports(cls, package) -> Availability:
        """Packages of a dtype its builder makes, converted from a checkpoint (the builder
        builds from that checkpoint; a fixture built from a seed has none)."""
        if package.spec.dtype not in cls.precisions:
            return Availability(False, cls._precision_refusal(package.spec.dtype))
        if not (read_source(package.root) or {}).get("content_hash"):
            return Availability(False, f"{cls.name} builds its model from the package's source "
                                       f"checkpoint; this package has no {SIDECAR} naming one "
                                       f"(a fixture built from a seed)")
        return Availability(True)

    @classmethod
    def _precision_refusal(cls, dtype: str) -> str:
        return (f"{cls.name} builds {', '.join(cls.precisions.values())} models (from "
                f"{', '.join(cls.precisions)} packages), not for a {dtype} package"
                + cls._dtype_note(dtype))

    @classmethod
    def _dtype_note(cls, dtype: str) -> str:
        return ""

    def provenance(self) -> dict[str, Any]:
        """The conversion this engine ran: onnxruntime-genai's builder, its version, the
        precision and provider, and the checkpoint's content hash (``build.json``)."""
        return {"conversion": "onnxruntime-genai builder", **self.build.record,
                "folder": str(self.build.folder),
                "session_options": dict(self.session_options)}

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False) -> DecodeResult:
        """Greedy through the generator: stops after emitting eos unless ``ignore_eos``
        (then ``min_length`` holds eos back and exactly ``max_new_tokens`` come back). Step
        times: the first covers the prompt's forward and its token."""
        og = self._og
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        ledger = self.reset_ledger()
        eos = self.package.spec.eos_id
        params = og.GeneratorParams(self.model)
        length = len(ids) + max_new_tokens
        options: dict[str, Any] = {"do_sample": False, "max_length": length}
        if ignore_eos:
            options["min_length"] = length
        params.set_search_options(**options)
        tokens: list[int] = []
        rows: list[np.ndarray] | None = [] if audit else None
        steps: list[float] = []
        start = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray([ids], dtype=np.int32))
        mark = start
        for _ in range(max_new_tokens):
            if rows is not None:  # the row that decides this token (computed on demand)
                rows.append(np.asarray(generator.get_logits())[0, -1].astype(np.float64))
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            now = time.perf_counter()
            steps.append(now - mark)
            mark = now
            tokens.append(token)
            if token == eos and not ignore_eos:
                break
        wall = time.perf_counter() - start
        del generator
        for n, seconds in enumerate(steps):
            ledger.record_forward("prefill" if n == 0 else "decode",
                                  len(ids) if n == 0 else 1, seconds)
        return DecodeResult(self.name, ids, tokens, ledger, wall, steps, rows)

    def teacher_forced(self, ids, chunk: int | None = None) -> tuple[list[int], np.ndarray]:
        """``ids`` appended to one generator ``chunk`` positions at a time (None: all at
        once), the row after each piece (``get_logits()`` holds the last position's only)."""
        og = self._og
        ids = [int(t) for t in ids]
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(ids) + 1)
        generator = og.Generator(self.model, params)
        step = len(ids) if chunk is None else int(chunk)
        positions, rows = [], []
        for start in range(0, len(ids), step):
            piece = ids[start:start + step]
            generator.append_tokens(np.asarray([piece], dtype=np.int32))
            positions.append(start + len(piece) - 1)
            rows.append(np.asarray(generator.get_logits())[0, -1].astype(np.float32))
        del generator
        return positions, np.stack(rows)

    def close(self) -> None:
        self.model = None


class OrtGenaiInt4Engine(OrtGenaiEngine):
    """onnxruntime-genai's int4 build (``-e cpu -p int4``) of a float32 package's checkpoint:
    a quantized engine. It declares the build's scheme (``MatMulNBits`` bits, block size and
    accuracy level, read from its graph: ``genai_dequant.build_scheme``) and is judged
    against float32 over its own weights dequantized exactly (``reference_package``: the
    build's graph with every quantized weight made a float32 initializer, cached beside the
    build), under the scheme's calibrated band (``docs/QUANTIZED.md``)."""

    name = "ort-genai-int4"
    description = ("onnxruntime-genai's generator over its builder's int4 model of the "
                   "package's checkpoint (CPU, MatMulNBits), judged against its own "
                   "dequantized weights")
    precisions: ClassVar[dict[str, str]] = {"float32": "int4"}

    def __init__(self, package, *, checkpoint=None):
        super().__init__(package, checkpoint=checkpoint)

        self.scheme = build_scheme(self.build.folder)
        if self.scheme["numeric_scheme"] is None:
            raise ExecutionError(
                f"the {self.name} build at {self.build.folder} holds no MatMulNBits: it is "
                f"not an int4 build", field="precision", value=self.build.precision,
                remedy="remove the build folder so that it is built again with -p int4")
        self._reference = dequantized_package_for(self.build)

    def numeric_scheme(self) -> str:
        return self.scheme["numeric_scheme"]

    def reference_package(self):
        return self._reference

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), **self.scheme,
                "reference_package": str(self._reference)}


def _cuda_ready() -> Availability:
    """Whether the CUDA build of onnxruntime-genai and a CUDA onnxruntime are here."""
    try:
        version = metadata.version("onnxruntime-genai-cuda")
    except metadata.PackageNotFoundError:
        return Availability(False, f"onnxruntime-genai-cuda is not installed; {INSTALL_CUDA}")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return Availability(False, f"onnxruntime {onnxruntime.__version__} has no CUDA "
                                   f"execution provider (onnxruntime-gpu is not the "
                                   f"onnxruntime loaded); {INSTALL_CUDA}")
    return Availability(True, f"onnxruntime-genai-cuda {version}, onnxruntime "
                              f"{onnxruntime.__version__}")


class OrtGenaiCudaEngine(OrtGenaiEngine):
    """The same on the GPU: ``-e cuda``, float16 (or bfloat16) like the package."""

    name = "ort-genai-cuda"
    description = ("onnxruntime-genai's generator on CUDA over the model its own builder "
                   "makes from the package's checkpoint (fp16/bf16 like the package)")
    residency = "cuda:0"
    provider: ClassVar[str] = "cuda"
    precisions: ClassVar[dict[str, str]] = {"float16": "fp16", "bfloat16": "bf16"}
    session_options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def availability(cls) -> Availability:
        found = _cuda_ready()
        if not found.ok:
            return found
        missing = genai_build.missing_builder_modules()
        if missing:
            return Availability(False, f"{found.reason}, but the model builder needs "
                                       f"{', '.join(missing)}; {genai_build.INSTALL}")
        return found

    @classmethod
    def _dtype_note(cls, dtype: str) -> str:
        if dtype == "float32":
            return (" (onnxruntime-genai 0.18's -e cuda -p fp32 builds fail to load: "
                    "'present.0.key does not exist')")
        return ""


__all__ = ["OrtGenaiCudaEngine", "OrtGenaiEngine", "OrtGenaiInt4Engine"]
