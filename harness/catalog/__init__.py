"""The built-in fixtures (``lockstep fixtures list|build``, ``--packages tiny_llama``):
deterministic packages built on first use and cached.

``builtin`` is the table (name -> builder, default seed, prompts; ``build``, ``list_fixtures``);
``conditioning`` keeps a seed only if the oracle never nears a tie; ``cache`` says where a
build lives and whether it is current. The builders: ``lookup_chained`` (the analytic table
decoder), ``llama_pair`` (a target and its draft), ``hybrid_graph`` / ``hybrid_mtp`` (gated
recurrences, convs, attention and an MTP head); the LLaMA-style ones use the converter's graph
builder (``harness.convert.llama_graph``).
"""
