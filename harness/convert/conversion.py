"""One conversion: a checkpoint read, written as a package, checked and published, or an
up-to-date conversion of the same bytes and options reused.

``convert(checkpoint, out=None, **options) -> ConvertResult`` is the converter's entry point
(``lockstep convert`` calls it); ``read_checkpoint`` reads either source format.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from engines.backends.genai_package import is_genai_build
from engines.errors import InputError
from engines.model_package.manifest import is_model_package
from engines.output_paths import check_apart
from engines.package import load_package, package_content_hash
from engines.package.hashing import checkpoint_hash
from harness.convert import cache, disk_room
from harness.convert.checkpoint import Architecture, Checkpoint
from harness.convert.context_room import check_max_context
from harness.convert.gguf_reader import declared_architecture, declared_head_dim, read_gguf
from harness.convert.hf_config import read_config
from harness.convert.hf_reader import is_hf_folder, read_architecture, read_hf_folder
from harness.convert.writer import (ConvertOptions, read_sidecar, speculative_suffix,
                                   write_converted)
from harness.staging import stage

log = logging.getLogger(__name__)  # the steps, for `lockstep convert`'s progress


@dataclass
class ConvertResult:
    folder: Path
    key: str
    source_hash: str
    reused: bool  # True: an up-to-date conversion was already there


def read_checkpoint(path: str | Path, with_tokenizer: bool = True) -> Checkpoint:
    """A GGUF file or a Hugging Face folder, read into a ``Checkpoint``."""
    path = Path(path).expanduser()
    if path.is_file():
        return read_gguf(path, with_tokenizer)
    if is_hf_folder(path):
        return read_hf_folder(path, with_tokenizer)
    what = "folder without config.json" if path.is_dir() else "path that does not exist"
    ggufs = sorted(path.glob("*.gguf")) if path.is_dir() else []
    remedy = (f"pass the GGUF file in it ({', '.join(str(g) for g in ggufs[:3])})" if ggufs
              else "pass a .gguf file, a Hugging Face folder (config.json + *.safetensors), "
                   "or 'smollm2'")
    if is_genai_build(path):  # another tool's conversion, read by another command
        remedy = f"an onnxruntime-genai build is wrapped: lockstep import-genai {path} -o PACKAGE"
    elif is_model_package(path):
        remedy = f"an onnx-genai model package is imported: lockstep import-package {path} -o " \
                 f"PACKAGE"
    raise InputError(f"{path} is a {what}", field="CHECKPOINT", value=str(path), remedy=remedy)


def convert(checkpoint: str | Path, out: str | Path | None = None, force: bool = False,
            **options) -> ConvertResult:
    """Convert ``checkpoint`` into ``out`` (default: the conversion cache), unless a
    conversion with the same checkpoint content, options and converter is already there
    (``force``: convert again). An ``out`` folder that holds anything but a lockstep
    conversion is refused before any work, unless ``force`` (then it is replaced).

    A float16 or bfloat16 conversion (with ``twin``, the default) first converts or reuses
    the checkpoint's float32 twin beside ``out`` and declares it as the package's reference;
    the twin's content hash is part of the conversion key."""
    opts = ConvertOptions(**options).checked()
    path = Path(checkpoint).expanduser()
    if not path.exists():
        read_checkpoint(path)  # raises the clear error
    folder = None if out is None else Path(out).expanduser().resolve()
    if folder is not None:  # before any work: a folder of the user's is never replaced
        check_apart(folder, path, "-o", "checkpoint")  # where --force could not help
        cache.claim_output(folder, force)
    precheck(path, opts)
    log.info("hashing %s", path.name)
    source_hash = checkpoint_hash(path)
    reference = None
    if opts.dtype != "float32" and opts.twin:
        twin_opts = opts.twin_options()
        twin_key = _key(source_hash, twin_opts, None)
        parent = cache.converted_root() if folder is None else folder.parent
        twin = convert(path, parent / _folder_name(path, twin_opts, twin_key),
                       **twin_opts.to_dict())
        reference = {"folder": twin.folder.name,
                     "content_hash": package_content_hash(twin.folder)}
    key = _key(source_hash, opts, reference)
    if folder is None:
        folder = cache.converted_root() / _folder_name(path, opts, key)
    if cache.is_current(folder, key) and not force:
        return ConvertResult(folder, key, source_hash, reused=True)
    if out is None:
        cache.claim_output(folder, force)
    log.info("reading %s (%s)", path.name, "dequantizing" if path.suffix == ".gguf" else "safetensors")
    ckpt = read_checkpoint(path, with_tokenizer=opts.tokenizer)
    what = f"{path.name} ({opts.dtype})"
    disk_room.require_room(folder.parent, disk_room.package_bytes(ckpt.weights, opts.dtype),
                           what)
    staged = stage(folder)  # named for this process; stale ones of killed converts go
    try:
        write_converted(ckpt, staged, opts, source_hash, key, reference)
        log.info("checking the package")
        load_package(staged)  # the package contract, checked before it is published
    except BaseException as exc:
        shutil.rmtree(staged, ignore_errors=True)
        full = disk_room.disk_full(exc, folder.parent, what)
        if full is not None:
            raise full from exc
        raise
    return ConvertResult(cache.publish(staged, folder), key, source_hash, reused=False)


def precheck(path: Path, opts: ConvertOptions) -> None:
    """Refuse what the checkpoint's metadata alone refuses before its weights are hashed,
    read or dequantized: a GGUF architecture the converter does not read from GGUF, a
    Hugging Face config with a bad value, a ``max_context`` past the format's limit or the
    memory its rotary tables need."""
    head_dim, tables = None, 1
    if path.is_file():
        arch = declared_architecture(path)
        head_dim = None if arch is None else declared_head_dim(path, arch)
    elif is_hf_folder(path):
        arch = read_architecture(read_config(path), str(path / "config.json"))
        head_dim, tables = arch.head_dim, 2 if arch.rope_local_base else 1
    else:
        read_checkpoint(path)  # a folder that is no checkpoint: named before it is hashed
    if opts.max_context is not None and head_dim:
        check_max_context(opts.max_context, head_dim, tables)


def _key(source_hash: str, opts: ConvertOptions, reference: dict | None) -> str:
    """The conversion key: checkpoint, options, converter sources and the reference's hash."""
    options = opts.to_dict() if reference is None else {**opts.to_dict(), "reference": reference}
    return cache.conversion_key(source_hash, options)


def _folder_name(path: Path, opts: ConvertOptions, key: str) -> str:
    return f"{_stem(path)}-{opts.cache}-{opts.dtype}{speculative_suffix(opts)}-{key[:12]}"


def _stem(path: Path) -> str:
    stem = path.stem if path.is_file() else path.name
    return "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in stem) or "checkpoint"


__all__ = ["Architecture", "Checkpoint", "ConvertOptions", "ConvertResult", "convert",
           "read_checkpoint", "read_sidecar"]
