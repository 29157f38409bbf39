"""What a ``--text`` or ``--chat`` run generated, one line per cell: the matrix shows
verdicts only, and a run of text prompts is read for its text."""
from __future__ import annotations

import json


def generated_lines(summary, package_refs) -> list[str]:
    """``package · mode · engine · prompt: "text"`` for each cell of a text or chat prompt
    that emitted tokens, decoded by its package's tokenizer (the text as a JSON string, so
    newlines stay on one line)."""
    cells = [c for c in summary.cells if c.tokens and c.prompt_source is not None
             and c.prompt_source.source.kind in ("text", "chat")]
    if not cells:
        return []
    from engines.tokenizer import decode_each
    from harness.packages import resolve_package

    packages = {}
    for ref in package_refs:
        package = resolve_package(ref)
        packages.setdefault(package.spec.name, package)
    lines = []
    for c in cells:
        if c.package not in packages:
            continue
        text = decode_each(packages[c.package], c.tokens, joined=True)
        lines.append(f"{c.package} · {c.mode} · {c.engine} · {c.prompt_name}: "
                     f"{json.dumps(text, ensure_ascii=False)}")
    return lines
