"""``lockstep import-genai BUILD_FOLDER -o PACKAGE``: an onnxruntime-genai build as a package.

The folder onnxruntime-genai's model builder writes (model.onnx, genai_config.json, the
tokenizer) is another engine's conversion; wrapped (``engines.backends.genai_package``) it
runs under lockstep's interpreter and is judged by the oracle like any package. Also the
second half of ``lockstep convert CHECKPOINT --builder onnxruntime-genai``, which first runs
the builder (``engines.backends.genai_build``, cached) on the checkpoint.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from engines.errors import InputError, LockstepError
from engines.output_paths import check_apart, check_output_folder
from engines.shipped_checkpoint import resolve_checkpoint
from harness.cli.arguments import package_name
from harness.cli.progress import converting_steps
from harness.staging import stage

# lockstep convert's --dtype -> the builder's -p
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-genai", help="wrap the folder onnxruntime-genai's model builder "
                                            "wrote as a lockstep package")
    p.add_argument("build", metavar="BUILD_FOLDER",
                   help="the folder the builder wrote (-o): genai_config.json, model.onnx and "
                        "its weights, tokenizer.json")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="PACKAGE",
                   help="the package folder to write (default: <BUILD_FOLDER>-package beside "
                        "the build)")
    p.add_argument("--prompts-from", metavar="PKG",
                   help="a package (folder or fixture name) whose prompts to copy; it must "
                        "share the build's tokenizer (default: lockstep's real prompts "
                        "through the build's tokenizer.json)")
    p.add_argument("--name", type=package_name("--name"), default=None,
                   help="the package name (default: genai-<build folder name>)")
    p.add_argument("--force", action="store_true",
                   help="replace the output folder if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    build = Path(args.build).expanduser().resolve()
    out = args.output if args.output is not None else build.parent / f"{build.name}-package"
    prompts = prompts_from(args.prompts_from, build) if args.prompts_from is not None else None
    return wrap_and_report(build, out, args.name, prompts, args.force)


def prompts_from(package: str, build: Path) -> list[list[int]]:
    """The prompts of another package (``--prompts-from``), each id inside ``build``'s
    vocabulary (another tokenizer's ids are refused here, by the option)."""
    from engines.backends.genai_package import read_genai_config
    from harness.packages import resolve_package

    try:
        prompts = [list(p) for p in resolve_package(package).spec.prompts]
    except LockstepError as err:  # named by the option the user gave
        raise InputError(err.message, field="--prompts-from", value=package,
                         remedy=err.remedy) from err
    vocab = read_genai_config(build)["model"]["vocab_size"]
    outside = next(((i, t) for i, p in enumerate(prompts) for t in p if t >= vocab), None)
    if outside is not None:
        raise InputError(f"{package}'s prompt {outside[0]} holds token id {outside[1]}, outside "
                         f"the build's vocabulary [0, {vocab}): another tokenizer's ids",
                         field="--prompts-from", value=package,
                         remedy="give a package that shares the build's tokenizer, or drop "
                                "--prompts-from (the build's tokenizer.json encodes "
                                "lockstep's prompts)")
    return prompts


def build_prompts(build: Path) -> list[list[int]] | None:
    """lockstep's real prompts through the build's tokenizer (ChatML ones only where the
    vocabulary knows ChatML); None (the wrapper's one BOS token) without a tokenizer."""
    path = build / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if not path.is_file():
        return None
    from harness.real_prompts import encode_prompts

    tokenizer = Tokenizer.from_file(str(path))
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    ids = encode_prompts(tokenizer, chat="<|im_start|>" in vocab and "<|im_end|>" in vocab)
    return [p for p in ids.values() if p] or None


@contextlib.contextmanager
def replacing(out: Path, source: Path, force: bool, what: str) -> Iterator[Path]:
    """The output folder, checked before any work (``engines.output_paths``: new or empty,
    else refused without ``force``; never the ``source`` it is made from, a folder holding it
    or one inside it). With ``force`` what it holds is set aside while the work runs and
    removed only once the work is done: an error or Ctrl-C puts it back."""
    check_apart(out, source, "-o", what)  # where --force could not help
    out = check_output_folder(out, "-o", force=force).resolve()
    aside = None
    if out.is_dir() and any(out.iterdir()):  # reached with --force only
        aside = stage(out)  # a staging name: a killed process's is removed by the next one
        os.rename(out, aside)
    try:
        yield out
    except BaseException:
        if aside is not None:
            shutil.rmtree(out, ignore_errors=True)
            os.rename(aside, out)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def wrap_and_report(build: Path, out: Path, name: str | None,
                    prompts: list[list[int]] | None, force: bool) -> int:
    """Wrap ``build`` into ``out`` with progress on stderr, then print what was written."""
    from engines.backends.genai_package import read_genai_config, wrap_genai_build

    read_genai_config(build)  # a genai build, before anything is set aside
    with replacing(out, build, force, "build") as out:
        if prompts is None:
            prompts = build_prompts(build)
        with converting_steps(f"importing {build.name}"):
            folder = wrap_genai_build(build, out, name, prompts)
    report(folder)
    return 0


def report(folder: Path) -> None:
    from engines.package import load_package

    package = load_package(folder)
    spec = package.spec
    console = Console(soft_wrap=True)
    console.print(f"wrapped: {folder}")
    console.print(f"  package {spec.name} ({package.content_hash[:19]}), {spec.dtype}, vocab "
                  f"{spec.vocab_size}, max_context {spec.max_context}, {len(spec.prompts)} "
                  f"prompt(s), tokenizer {'yes' if spec.tokenizer else 'no'}")
    console.print(f"  next: lockstep run --engines ort-cpu,native-host --packages {folder}")


def require_builder() -> str:
    """onnxruntime-genai's version, or the error (naming ``--builder``) saying how to
    install it and its builder."""
    from engines.backends.genai_build import require_builder as required

    return required(field="--builder", value="onnxruntime-genai")


def convert_with_builder(args: argparse.Namespace) -> int:
    """``lockstep convert CHECKPOINT --builder onnxruntime-genai``: the builder's model of
    the checkpoint (cached), wrapped into ``-o`` (default: beside the build, in the cache)."""
    from engines.backends import genai_build
    from engines.backends.checkpoint_source import CheckpointSource, content_hash
    from engines.backends.genai_package import genai_package_folder, genai_package_for

    unused = [flag for flag, given in (
        ("--cache", args.cache != "dynamic"), ("--no-twin", args.no_twin),
        ("--max-context", args.max_context is not None),
        ("--draft-layers", args.draft_layers is not None),
        ("--prompt-lookup", args.prompt_lookup is not None),
        ("--no-tokenizer", args.no_tokenizer)) if given]
    if unused:
        raise InputError(f"{unused[0]} applies to lockstep's own converter only",
                         field=unused[0], value="--builder onnxruntime-genai",
                         remedy=f"drop {unused[0]}, or use --builder lockstep")
    if args.output is None and args.name is not None:
        raise InputError("--name needs -o: the cached package keeps its own name",
                         field="--name", value=args.name, remedy="add -o PACKAGE, or drop --name")
    path = resolve_checkpoint(args.checkpoint)
    if args.output is not None:  # before the builder's minutes
        check_apart(args.output, path, "-o", "checkpoint")
        check_output_folder(args.output, "-o", force=args.force)
    version = require_builder()
    if not path.exists():
        raise InputError(f"{path} does not exist", field="CHECKPOINT", value=str(path),
                         remedy="give a .gguf file, a Hugging Face folder, or smollm2")
    with converting_steps(f"building {path.name}") as progress:
        progress.step(f"hashing {path.name}")
        source = CheckpointSource(path, "gguf" if path.is_file() else "hf", content_hash(path))
        progress.step(f"running onnxruntime-genai {version}'s model builder (minutes; cached "
                      f"under {genai_build.cache_folder()})")
        build = genai_build.ensure_build(source, PRECISIONS[args.dtype], "cpu")
    if args.output is not None:
        return wrap_and_report(build.folder, args.output, args.name, None, args.force)
    if args.force:  # else reused while the build, the wrapper and the prompts are unchanged
        shutil.rmtree(genai_package_folder(build), ignore_errors=True)
    with converting_steps(f"importing {build.folder.name}"):
        folder = genai_package_for(build, build_prompts(build.folder))
    report(folder)
    return 0


__all__ = ["build_prompts", "convert_with_builder", "register", "require_builder", "run"]
