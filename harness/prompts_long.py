"""Long-context prompts (1-2k tokens) for the nightly GPU run, built deterministically.

The text is ours (``harness/texts/long_context.txt``, written for lockstep): whole
paragraphs are taken in order, cycling, for as long as the package's tokenizer keeps the
prompt within a token budget, so each prompt is real prose of a known length for that
tokenizer. ``python -m harness.prompts_long PACKAGE --out FILE`` writes the JSONL that
``lockstep run --prompts`` reads (two text prompts and one chat) and prints each prompt's
length as the run will encode it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engines.tokenizer import package_chat_template, package_tokenizer
from harness.packages import resolve_package
from harness.prompts import read_prompts_file, resolve

TEXT_FILE = Path(__file__).resolve().parent / "texts" / "long_context.txt"
# name, token budget (the prompt stays within it and is at least 1000 tokens long: paragraphs
# are at most ~200 tokens), kind; 2048 + 256 new tokens fit a converted package's default
# dynamic context (4096)
PLAN = (("long_1k", 1280, "text"), ("long_2k", 2048, "text"), ("long_chat", 1536, "chat"))
QUESTION = "\n\nIn two sentences: what did the keeper decide at the end, and why?"


def paragraphs(path: Path = TEXT_FILE) -> list[str]:
    return [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def text_within(budget: int, count, suffix: str = "") -> str:
    """Whole paragraphs in order (cycling) + ``suffix``, as many as keep ``count(text)``
    within ``budget``; at least one paragraph."""
    parts = paragraphs()
    chosen = [parts[0]]
    i = 1
    while True:
        longer = chosen + [parts[i % len(parts)]]
        if count("\n\n".join(longer) + suffix) > budget:
            return "\n\n".join(chosen) + suffix
        chosen, i = longer, i + 1


def long_prompts(package) -> list[dict]:
    """The JSONL lines for ``package``: each prompt's length counted as ``harness.prompts``
    encodes it (text with the tokenizer's special tokens; a chat rendered by the package's
    template, without them)."""
    tok = package_tokenizer(package)
    chat = package_chat_template(package, tok)
    lines = []
    for name, budget, kind in PLAN:
        if kind == "text":
            text = text_within(budget, lambda t: len(tok.encode(t, add_special_tokens=True)))
            lines.append({"name": name, "text": text})
        else:
            def count(t):
                return len(tok.encode(chat.render([{"role": "user", "content": t}])))

            content = text_within(budget, count, QUESTION)
            lines.append({"name": name, "chat": [{"role": "user", "content": content}]})
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.prompts_long",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("package", help="a package folder (with a tokenizer and chat template)")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    args = parser.parse_args(argv)
    package = resolve_package(args.package)
    lines = long_prompts(package)
    args.out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    for source in read_prompts_file(args.out):
        print(f"{source.name}: {len(resolve(source, package).ids)} tokens ({source.kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
