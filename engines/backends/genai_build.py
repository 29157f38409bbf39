"""onnxruntime-genai's own model builder, run on the checkpoint lockstep converts, cached.

``ort-genai`` is judged as an outside engine: its graph, weight layout and precision come
from onnxruntime-genai's builder (``python -m onnxruntime_genai.models.builder``); only the
checkpoint is shared with lockstep's converter. The builder reads float GGUFs and Hugging
Face folders, so a quantised GGUF is first dequantised to a float32 GGUF with the ``gguf``
package, and the configuration and tokenizer transformers reads from the GGUF are saved to
a folder for ``-m`` (the builder would otherwise ask the hub). A build is cached under
``$LOCKSTEP_CACHE/genai/`` keyed by the checkpoint's content hash, the builder's version,
the precision, the execution provider and this module's own bytes; ``build.json`` in the
build folder records all of them (it is what evidence cites as the engine's conversion).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.backends.checkpoint_source import CheckpointSource, content_hash
from engines.backends.genai_dequant import dequantized_package_for
from engines.backends.transformers_quiet import quiet_transformers
from engines.cache_root import cache_root
from engines.errors import EngineUnavailable, ExecutionError, InputError, LockstepError
from engines.gguf_fields import copy_gguf_fields
from engines.shipped_checkpoint import resolve_checkpoint

BUILD_FILE = "build.json"
BUILDER = "onnxruntime-genai"
BUILDER_MODULE = "onnxruntime_genai.models.builder"
GENAI_DISTRIBUTIONS = ("onnxruntime-genai", "onnxruntime-genai-cuda")
# what the builder imports besides onnxruntime_genai (and gguf, for a GGUF input)
BUILDER_MODULES = {"torch": "torch==2.13.0", "transformers": "transformers",
                   "onnx_ir": "onnx-ir", "gguf": "gguf", "onnx": "onnx"}
INSTALL = ("pip install onnxruntime-genai onnx-ir torch==2.13.0 transformers gguf (lockstep's "
           "genai extra; make real installs it)")
FLOAT_GGUF_TYPES = ("F32", "F16", "BF16")


def genai_version() -> str | None:
    """The installed onnxruntime-genai distribution's version (CPU or CUDA wheel)."""
    for dist in GENAI_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def missing_builder_modules() -> list[str]:
    """The pip names of the builder's dependencies that are not importable here."""
    return [pip for mod, pip in BUILDER_MODULES.items() if importlib.util.find_spec(mod) is None]


@dataclass(frozen=True)
class GenaiBuild:
    """One finished build: its folder and what made it (``build.json``)."""

    folder: Path
    record: dict

    @property
    def precision(self) -> str:
        return self.record["precision"]


def _own_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def build_key(checkpoint_hash: str, precision: str, provider: str, version: str) -> str:
    text = json.dumps({"checkpoint": checkpoint_hash, "precision": precision,
                       "provider": provider, "builder": BUILDER, "version": version,
                       "recipe": _own_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_folder() -> Path:
    return cache_root() / "genai"


def dequantize_gguf(src: Path, dst: Path) -> Path:
    """Write ``src`` (any GGUF the gguf package can dequantise) as a float32 GGUF: every
    key/value copied, every tensor dequantised by ``gguf.quants.dequantize``."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"]
    writer = gguf.GGUFWriter(str(dst), bytes(arch.parts[arch.data[0]]).decode())
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    copy_gguf_fields(reader, writer, skip)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def gguf_config_folder(gguf_path: Path, out: Path) -> Path:
    """The configuration and tokenizer transformers reads from a GGUF, saved as a folder
    (with ``architectures`` set: the builder dispatches on it)."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if not config.architectures:
        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        if arch is None:
            raise EngineUnavailable(
                f"transformers knows no causal-LM class for GGUF architecture "
                f"{config.model_type!r}", field="architecture", value=config.model_type,
                remedy="build from a Hugging Face folder of the checkpoint instead")
        config.architectures = [arch]
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    return out


def _float_gguf(path: Path) -> bool:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return all(t.tensor_type.name in FLOAT_GGUF_TYPES for t in reader.tensors)


def run_builder(args: list[str], log: Path, timeout: float) -> None:
    """The builder in a subprocess (offline: nothing may come from the hub)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", BUILDER_MODULE, *args], stdout=fh,
                              stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-6:]
        raise ExecutionError(
            f"onnxruntime-genai's builder failed (exit {proc.returncode}): "
            + " | ".join(tail), field="builder", value=" ".join(args),
            remedy=f"see {log}; the precision/provider pairs it can load are in "
                   f"shared/ONNXRUNTIME_GENAI.md")


def require_builder(field: str = "package", value: str | None = None) -> str:
    """onnxruntime-genai's version, or ``EngineUnavailable`` saying how to install it and
    what its builder imports. ``field``/``value`` name what asked for it (the CLI: its
    ``--builder`` option); by default the package and the missing modules."""
    version = genai_version()
    if version is None:
        raise EngineUnavailable("onnxruntime-genai is not installed", field=field,
                                value="onnxruntime-genai", remedy=INSTALL)
    missing = missing_builder_modules()
    if missing:
        raise EngineUnavailable(
            f"onnxruntime-genai's model builder needs {', '.join(missing)}, not installed",
            field=field, value=missing if value is None else value, remedy=INSTALL)
    return version


def ensure_build(checkpoint, precision: str, provider: str,
                 timeout: float = 900.0) -> GenaiBuild:
    """The cached build of ``checkpoint`` (a ``CheckpointSource``) for ``precision``
    (``fp32``, ``fp16``, ``bf16``) and ``provider`` (``cpu``, ``cuda``), built on first use.
    Raises
    :class:`EngineUnavailable` when the genai package or the builder's dependencies are
    missing."""
    version = require_builder()
    key = build_key(checkpoint.content_hash, precision, provider, version)
    stem = checkpoint.path.stem if checkpoint.path.is_file() else checkpoint.path.name
    # one folder per checkpoint, provider and precision: a stale build (another builder
    # version, this module edited) is replaced, not kept beside it (each is ~0.5 GB)
    folder = cache_folder() / f"{stem}-{provider}-{precision}"
    found = _current(folder, key)
    if found is not None:
        return found
    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    work = staged / "_work"
    work.mkdir(parents=True)
    start = time.perf_counter()
    try:
        args = ["-o", str(staged), "-p", precision, "-e", provider, "-c", str(work / "hub")]
        if checkpoint.kind == "gguf":
            source = checkpoint.path
            if not _float_gguf(source):
                source = dequantize_gguf(checkpoint.path, work / "float32.gguf")
            with quiet_transformers():
                config = gguf_config_folder(checkpoint.path, work / "config")
            args += ["-m", str(config), "-i", str(source)]
        else:  # a Hugging Face folder carries its own config.json and tokenizer
            args += ["-i", str(checkpoint.path)]
        run_builder(args, work / "builder.log", timeout)
        (staged / "builder.log").write_bytes((work / "builder.log").read_bytes())
        shutil.rmtree(work)
        record = {"builder": BUILDER, "builder_version": version, "precision": precision,
                  "execution_provider": provider, "key": key,
                  "checkpoint": checkpoint.to_dict(),
                  "build_seconds": round(time.perf_counter() - start, 2)}
        (staged / BUILD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if folder.exists() and _current(folder, key) is None:
            shutil.rmtree(folder, ignore_errors=True)  # an older build under this name
        try:
            staged.rename(folder)
        except OSError:  # another process published the same build meanwhile
            current = _current(folder, key)
            if current is None:
                raise
            shutil.rmtree(staged, ignore_errors=True)
            return current
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return GenaiBuild(folder, record)


def _current(folder: Path, key: str) -> GenaiBuild | None:
    found = read_build(folder)
    return found if found is not None and found.record.get("key") == key else None


def read_build(folder: Path) -> GenaiBuild | None:
    """A finished build folder (None when absent or incomplete)."""
    path = Path(folder) / BUILD_FILE
    if not path.is_file() or not (Path(folder) / "genai_config.json").is_file():
        return None
    try:
        return GenaiBuild(Path(folder), json.loads(path.read_text()))
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m engines.backends.genai_build CHECKPOINT [-p fp32] [-e cpu] [--reference]``:
    build (or reuse) onnxruntime-genai's model of a checkpoint (``smollm2``: the shipped one)
    and print its folder; ``--reference`` also makes (or reuses) the float32 package over the
    build's own dequantized weights, what ``ort-genai-int4`` is judged against, and prints its
    folder. ``make real`` runs it so the suite finds both cached."""
    parser = argparse.ArgumentParser(prog="python -m engines.backends.genai_build")
    parser.add_argument("checkpoint", help="a .gguf file, a Hugging Face folder, or smollm2")
    parser.add_argument("-p", "--precision", default="fp32")
    parser.add_argument("-e", "--provider", default="cpu")
    parser.add_argument("--reference", action="store_true",
                        help="also the float32 package over the dequantized weights")
    args = parser.parse_args(argv)
    try:
        path = resolve_checkpoint(args.checkpoint)
        if not path.exists():
            raise InputError(f"{path} does not exist", field="CHECKPOINT", value=str(path),
                             remedy="give a .gguf file, a Hugging Face folder, or smollm2")
        source = CheckpointSource(path, "gguf" if path.is_file() else "hf", content_hash(path))
        build = ensure_build(source, args.precision, args.provider)
        reference = dequantized_package_for(build) if args.reference else None
    except (LockstepError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(build.folder)
    if reference is not None:
        print(reference)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["BUILD_FILE", "GenaiBuild", "INSTALL", "build_key", "dequantize_gguf",
           "ensure_build", "genai_version", "gguf_config_folder", "missing_builder_modules",
           "read_build"]
