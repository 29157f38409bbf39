"""``scripts/spec_loop_counts.py``'s what-ifs: a proposer that drafts only on longer matches
(the package's section replaced, the tokens still greedy's), and the counts priced with a
device's costs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engines.registry import get_engine_class
from engines.workflow import greedy_decode
from engines.workflow.prompt_lookup import PromptLookupProposer
from engines.workflow.speculative import speculative_decode
from harness.packages import resolve_package
from suites.lookup_support import with_prompt_lookup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import spec_loop_counts as script  # noqa: E402

COSTS = {"forward": 1.0, "verify": 1.5, "plain_host": 0.25, "round_host": 2.0}


def test_a_loop_is_priced_by_its_counts_and_greedy_by_its_tokens():
    loop = {"decode": 10, "verify": 4, "plain_reads": 6, "shifted_rounds": 3,
            "classic_rounds": 1}
    got = script.modeled(loop, 30, COSTS)
    assert got["ms"] == 10 * 1.0 + 4 * 1.5 + 6 * 0.25 + 4 * 2.0
    assert got["greedy_ms"] == 30 * 1.25
    assert got["x_greedy"] == round(37.5 / 25.5, 3)


def test_costs_must_name_all_four():
    assert script.parse_costs("forward=1,verify=2,plain_host=0.5,round_host=1") == {
        "forward": 1.0, "verify": 2.0, "plain_host": 0.5, "round_host": 1.0}
    with pytest.raises(SystemExit, match="round_host"):
        script.parse_costs("forward=1,verify=2,plain_host=0.5")


def test_a_longer_least_match_drafts_less_and_decodes_the_same(tmp_path):
    package = with_prompt_lookup(resolve_package("tiny_llama_static").root, tmp_path / "p", 4,
                                 max_ngram=3, min_ngram=1)
    engine = get_engine_class("ort-cpu")(package)
    prompts = [list(p) for p in package.spec.prompts]
    greedy = [greedy_decode(engine, p, 24).tokens for p in prompts]
    before = [speculative_decode(engine, p, 24, 4) for p in prompts]
    script.with_min_ngram(package, 3)
    assert PromptLookupProposer(package.spec.decoding.speculative).sizes == [3]
    after = [speculative_decode(engine, p, 24, 4) for p in prompts]
    assert [r.tokens for r in before] == [r.tokens for r in after] == greedy
    assert (sum(sum(r.widths_per_round) for r in after)
            < sum(sum(r.widths_per_round) for r in before))
    with pytest.raises(SystemExit, match="outside"):
        script.with_min_ngram(package, 4)
