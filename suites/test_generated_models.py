"""Generated decoders: every host engine agrees with the oracle, margin-aware.

The strategy (``fixtures.strategies.decoder_configs``) draws layers 1-3, every query/KV
grouping ratio, head_dim, hidden, vocab, max context, prompt length, cache kind and
float32/float16; a package is built on the fly. Every engine's tokens are judged on the
engine's own prefix (``harness.judgement.judge_stream``). Generated weights are not conditioned,
so a token within the dtype's near-tie tolerance of the oracle's best is counted (a
Hypothesis event), not failed; a ``defect`` fails and Hypothesis shrinks it to the smallest
configuration, whose repr carries the seed that rebuilds the package.
"""
from __future__ import annotations

import pytest
from hypothesis import event, given, note

from engines.oracle import Oracle
from engines.package import load_package
from engines.registry import get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from fixtures.strategies import build_generated, decoder_configs
from harness.judgement import judge_stream
from suites.support import HOST_ENGINES

NEW_TOKENS = 8


@pytest.mark.claim("token_identity")
@given(case=decoder_configs())
def test_host_engines_agree_with_the_oracle(tmp_path_factory, case):
    folder = build_generated(case, tmp_path_factory.mktemp("generated"))
    package = load_package(folder)
    note(f"rebuild with: build_generated({case!r}, folder)")
    oracle = Oracle(package)  # one oracle: engines that agree share its rows
    tol = tolerance_for(package.spec.dtype)
    for name in HOST_ENGINES:
        cls = get_engine_class(name)
        if not cls.availability().ok:
            pytest.fail(f"host engine {name} unavailable: {cls.availability().reason}")
        result = greedy_decode(cls(package), list(case.prompt), NEW_TOKENS)
        j = judge_stream(oracle, list(case.prompt), result.tokens, NEW_TOKENS, tol)
        if j.findings:
            event(f"{j.verdict} ({name})")
        assert j.defects == 0, (
            f"{name}: {j.defects} defect step(s), first at step {j.first.step}: engine "
            f"{j.first.engine_token}, oracle {j.first.oracle_token} ({j.first.reason}); "
            f"findings {j.findings}; seed {case.seed}, config {case.config!r}")
