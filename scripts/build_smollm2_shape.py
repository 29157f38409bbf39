"""A random package of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads over 3 kv heads,
vocabulary 49152, tied head, mixed precision, context 512): what the GPU probes time when
no checkpoint is staged. Usage: python scripts/build_smollm2_shape.py DIR DTYPE-CACHE
(e.g. float16-static, float16-append, bfloat16-static)."""
from __future__ import annotations

import sys
from pathlib import Path

from harness.convert.llama_config import LlamaConfig
from harness.convert.llama_graph import build_llama


def main(path: str, variant: str) -> int:
    dtype, cache = variant.split("-")
    shape = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                 vocab=49152, tied=True, cache=cache, max_context=512, dtype=dtype,
                 precision="mixed")
    prompt = [[(7 * i + 3) % 49152 for i in range(16)]]
    build_llama(Path(path), LlamaConfig(**shape), prompt, name=f"smollm2_shape_{dtype}_{cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
