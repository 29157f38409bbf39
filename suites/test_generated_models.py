"""Generated decoders: every host engine agrees with the oracle, margin-aware.

The strategy (``fixtures.strategies.decoder_configs``) draws layers 1-3, every query/KV
grouping ratio, head_dim, hidden, vocab, max context, prompt length, cache kind and
float32/float16; a package is built on the fly. Generated weights are not conditioned, so a
divergence at a step whose oracle margin is below the dtype's near-tie tolerance is counted
(a Hypothesis event), not failed; a ``defect`` fails and Hypothesis shrinks it to the
smallest configuration, whose repr carries the seed that rebuilds the package.
"""
from __future__ import annotations

import pytest
from hypothesis import event, given, note

from engines.oracle import oracle_decode
from engines.package import load_package
from engines.registry import get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from fixtures.strategies import build_generated, decoder_configs
from harness.compare import DEFECT, compare_tokens
from suites.support import HOST_ENGINES

NEW_TOKENS = 8


@given(case=decoder_configs())
def test_host_engines_agree_with_the_oracle(tmp_path_factory, case):
    folder = build_generated(case, tmp_path_factory.mktemp("generated"))
    package = load_package(folder)
    note(f"rebuild with: build_generated({case!r}, folder)")
    oracle = oracle_decode(package, list(case.prompt), NEW_TOKENS)
    near_tie = tolerance_for(case.config.dtype).near_tie_margin
    for name in HOST_ENGINES:
        cls = get_engine_class(name)
        if not cls.availability().ok:
            pytest.fail(f"host engine {name} unavailable: {cls.availability().reason}")
        result = greedy_decode(cls(package), list(case.prompt), NEW_TOKENS)
        div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, near_tie)
        if div is not None:
            event(f"{div.verdict} ({name})")
        assert div is None or div.verdict != DEFECT, (
            f"{name} diverged from the oracle at step {div.step}: {div.engine_token} vs "
            f"{div.reference_token}, oracle margin {div.margin:.4g} (near-tie below {near_tie}); "
            f"seed {case.seed}, config {case.config!r}")
