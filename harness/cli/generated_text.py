"""What a ``--text`` or ``--chat`` run generated, one line per cell: the matrix shows
verdicts only, and a run of text prompts is read for its text."""
from __future__ import annotations

import json


def generated_lines(summary) -> list[str]:
    """``package · mode · engine · prompt: "text"`` for each cell of a text or chat prompt
    that emitted tokens (the text its runner decoded with the package's tokenizer, as a JSON
    string, so newlines stay on one line)."""
    return [f"{c.package} · {c.mode} · {c.engine} · {c.prompt_name}: "
            f"{json.dumps(c.text, ensure_ascii=False)}"
            for c in summary.cells if c.text is not None]
