"""Prompt lookup (kind ``prompt-lookup``): drafts copied from the sequence itself, verified
as every other proposer's are.

The proposer copies what followed the latest earlier occurrence of the sequence's final
n-gram; the one speculative session verifies, accepts and rolls back. Claims here: the
drafts are the rule's (against a brute-force search); the streams equal greedy and the
oracle at every width on a static kv target and on a recurrent one (snapshot, restore,
re-advance); a round reads back 8 bytes and its proposer nothing; whatever the proposer
proposes, the verifier decides every token (garbage drafts cost acceptance only); on SmolLM2
a grounded prompt accepts far more than a free one; the section is validated, and the
converter writes it.
"""
from __future__ import annotations

import random

import pytest
import yaml

from engines.errors import InputError, PackageError
from engines.oracle import oracle_decode
from engines.package import load_package
from engines.registry import get_engine_class
from engines.workflow import greedy_decode
from engines.workflow.prompt_lookup import PromptLookupProposer
from engines.workflow.speculative import speculative_decode
from harness.budgets import expected_readback
from harness.packages import resolve_package
from suites.lookup_support import with_prompt_lookup
from suites.test_speculative_ignore_eos import SimulatedDevice

NEW_TOKENS = 32
WIDTH = 6
# a static kv target at every width, and a recurrent one (snapshot, restore, re-advance) at
# the widest
FIXTURES = {"tiny_llama_static": range(1, WIDTH + 1), "hybrid_mtp": (WIDTH,)}
SP = "decoding.speculative"


class Ngrams:
    """A spec's n-gram bounds (what ``PromptLookupProposer`` reads)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram


def brute_force(sequence: list[int], width: int, max_ngram: int = 3, min_ngram: int = 1):
    """The rule, searched from scratch: for n from max_ngram down, the latest j < L - n with
    sequence[j:j+n] equal to the last n tokens; the drafts copy on from j + n, through the
    drafts themselves where the sequence ends."""
    length = len(sequence)
    for n in range(max_ngram, min_ngram - 1, -1):
        for j in range(length - n - 1, -1, -1):
            if sequence[j:j + n] == sequence[length - n:]:
                extended = list(sequence)
                for k in range(width):
                    extended.append(extended[j + n + k])
                return extended[length:]
    return []


# -- the proposer ---------------------------------------------------------------------------

@pytest.mark.parametrize("sequence, width, ngrams, drafts", [
    # the final 3-gram (1 2 3) occurred at 1..3: copy what followed, though (2 3) is later
    ([7, 1, 2, 3, 5, 6, 0, 2, 3, 9, 1, 2, 3], 4, (3, 1), [5, 6, 0, 2]),
    # the latest earlier occurrence of (1 2) wins; the copy runs on through its own drafts
    ([1, 2, 5, 1, 2, 6, 1, 2], 5, (3, 1), [6, 1, 2, 6, 1]),
    ([4, 5, 4, 5, 4], 5, (3, 1), [5, 4, 5, 4, 5]),  # a repeating pattern repeats
    ([1, 2, 3], 4, (3, 1), []),  # the last token never occurred before: nothing to copy
    ([1, 2, 3, 2], 4, (3, 2), []),  # (2) occurred, but the shortest n-gram is 2
    ([1, 2, 3, 2], 2, (3, 1), [3, 2]),
])
def test_drafts_copy_what_followed_the_latest_earlier_final_ngram(sequence, width, ngrams,
                                                                  drafts):
    assert PromptLookupProposer(Ngrams(*ngrams)).propose(sequence, width) == drafts
    assert brute_force(sequence, width, *ngrams) == drafts


def test_the_incremental_index_drafts_what_a_search_from_scratch_finds():
    """Sequences grown round by round (as the session grows them) over small vocabularies,
    and a sequence that is not a continuation of the last (indexed afresh)."""
    rng = random.Random(7)
    for case in range(120):
        vocab, ngrams = rng.choice((2, 3, 5, 12)), rng.choice(((3, 1), (2, 1), (4, 2)))
        proposer = PromptLookupProposer(Ngrams(*ngrams))
        sequence = [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        for _ in range(12):
            width = rng.randrange(1, 7)
            assert proposer.propose(sequence, width) == brute_force(sequence, width, *ngrams), \
                (case, sequence, width, ngrams)
            sequence += [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
        other = [rng.randrange(vocab) for _ in range(9)]
        assert proposer.propose(other, 3) == brute_force(other, 3, *ngrams)


# -- speculative decoding with it -----------------------------------------------------------

@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lookup")
    return {name: with_prompt_lookup(resolve_package(name).root, folder / name, WIDTH)
            for name in FIXTURES}


def check_rounds(result, package, width: int, new_tokens: int = NEW_TOKENS) -> None:
    """The ledger and the rounds agree: no proposer forward; a classic round W drafts over
    W + 1 positions, a shifted one (its pending token fed by the decode forward before it)
    W + 1 drafts over W + 1 positions, each narrower only where the context had no room;
    every token is the prefill's, a round's (accepted drafts + bonus, the last cut at
    max_new_tokens) or a plain step's read (a decode forward a shifted round judged, or one
    undone past eos, reads none)."""
    led, acc, widths = result.ledger, result.acceptance_per_round, result.widths_per_round
    shifted = result.shifted_per_round
    assert led.forwards["propose"] == 0 and led.proposals == len(acc) == len(widths)
    assert len(shifted) == len(widths) and led.shifted_verifications == sum(shifted)
    assert led.forward_positions["verify"] == sum(w + (not s) for w, s in zip(widths, shifted))
    for start, w, s in zip(result.start_per_round, widths, shifted):
        assert w == width + s or start + width + 1 + s > package.spec.max_context, (start, w)
    committed = 1 + led.forwards["decode"] - led.shifted_verifications - led.discarded_forwards
    for n in acc:
        committed += min(n + 1, new_tokens - committed)
    assert committed == len(result.tokens) == new_tokens
    assert led.readback_total == 0 and led.host_staging == 0  # a host engine


@pytest.mark.claim("spec_equals_greedy", "token_identity")
@pytest.mark.parametrize("package_name", FIXTURES)
def test_prompt_lookup_equals_greedy_equals_oracle_at_every_width(lookup, engine_cache,
                                                                  package_name):
    """native-host (batch-invariant: exact), every prompt; the rounds see full accepts,
    rejections and plain steps (no match), and the recurrent target restores."""
    package = lookup[package_name]
    engine = engine_cache("native-host", package)
    seen = {"full_accepts": 0, "rejected": 0, "restores": 0, "plain": 0}
    for prompt in package.spec.prompts:
        greedy = greedy_decode(engine, prompt, NEW_TOKENS).tokens
        assert greedy == oracle_decode(package, prompt, NEW_TOKENS).tokens
        for width in FIXTURES[package_name]:
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
            assert result.tokens == greedy, (package_name, prompt, width)
            check_rounds(result, package, width)
            led = result.ledger
            for key in ("full_accepts", "rejected", "restores"):
                seen[key] += getattr(led, key)
            seen["plain"] += led.forwards["decode"] > 1
    wanted = {k for k in seen if k != "restores" or package.spec.decoding.speculative.snapshot}
    assert all(seen[k] for k in wanted), seen


def test_rounds_narrow_where_the_context_has_no_room_for_a_full_one(lookup, engine_cache):
    """A decode that fills the static cache to max_context: the last rounds cannot verify W
    drafts past its end, so they narrow (never overrun), and the stream is greedy's."""
    package = lookup["tiny_llama_static"]
    engine = engine_cache("native-host", package)
    prompt = package.spec.prompts[1]
    room = package.spec.max_context - len(prompt)
    result = speculative_decode(engine, prompt, room, WIDTH)
    assert result.tokens == greedy_decode(engine, prompt, room).tokens
    narrowed = [(start, w) for start, w in zip(result.start_per_round, result.widths_per_round)
                if w < WIDTH]
    assert narrowed and all(start + WIDTH + 1 > package.spec.max_context
                            for start, _ in narrowed)


def test_ort_cpu_decodes_the_same_with_prompt_lookup(lookup, engine_cache):
    package = lookup["tiny_llama_static"]
    engine = engine_cache("ort-cpu", package)
    for prompt in package.spec.prompts:
        result = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
        assert result.tokens == greedy_decode(engine, prompt, NEW_TOKENS).tokens
        check_rounds(result, package, WIDTH)


@pytest.mark.claim("readback_budget")
def test_a_round_reads_back_eight_bytes_and_the_proposer_nothing(lookup):
    """On a simulated device (host ops accounting crossings as a device does): 4 bytes for
    the prefill's token and each plain step read, 8 per verification, none for drafting; the
    budget harness.budgets states is that exactly."""
    engine = SimulatedDevice(lookup["tiny_llama_static"])
    result = speculative_decode(engine, engine.package.spec.prompts[1], NEW_TOKENS, WIDTH)
    led = result.ledger
    assert led.proposals > 0 and sum(result.widths_per_round) > led.proposals
    reads = 1 + led.forwards["decode"] - led.shifted_verifications - led.discarded_forwards
    assert dict(led.readback_bytes) == {"token_id": 4 * (reads + led.proposals),
                                        "accept_count": 4 * led.proposals, "logits_audit": 0}
    assert expected_readback(result)[0] == led.readback_total
    assert "nothing per proposer step" in expected_readback(result)[1]


@pytest.mark.claim("spec_equals_greedy")
@pytest.mark.parametrize("bug", ["garbage", "off-by-one"])
def test_a_wrong_proposer_costs_acceptance_never_a_token(lookup, engine_cache, monkeypatch,
                                                         bug):
    """A planted proposer bug cannot hide in the stream: the verifier decides every token.
    Garbage drafts (ids the stream never takes) and drafts copied one position late both
    leave the tokens greedy's and only lower acceptance."""
    package = lookup["tiny_llama_static"]
    engine = engine_cache("native-host", package)
    prompt = package.spec.prompts[1]
    honest = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
    propose = PromptLookupProposer.propose

    def planted(self, sequence, width):
        drafts = propose(self, sequence, width + 1)
        if bug == "garbage":
            return [(t * 7 + 3) % package.spec.vocab_size for t in drafts[:width]]
        return drafts[1:]

    monkeypatch.setattr(PromptLookupProposer, "propose", planted)
    wrong = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
    assert wrong.tokens == honest.tokens == greedy_decode(engine, prompt, NEW_TOKENS).tokens
    assert sum(wrong.acceptance_per_round) < sum(honest.acceptance_per_round)


# -- the section ----------------------------------------------------------------------------

def _edit(folder, change):
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc["decoding"]["speculative"], doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


@pytest.mark.parametrize("change, field, value, needle", [
    (lambda sp, d: sp.update(proposer="target"), f"{SP}.proposer", "target", "runs no component"),
    (lambda sp, d: sp.pop("max_ngram"), f"{SP}.max_ngram", None, "needs max_ngram"),
    (lambda sp, d: sp.update(min_ngram=4), f"{SP}.min_ngram", 4, "above max_ngram 3"),
    (lambda sp, d: sp.update(max_ngram=17), f"{SP}.max_ngram", 17, "must be <= 16"),
    (lambda sp, d: sp.update(carry={"output": "logits", "seed": "logits"}), f"{SP}.carry",
     {"input": None, "output": "logits", "seed": "logits"}, "has none"),
    (lambda sp, d: sp.update(kind="draft"), f"{SP}.proposer", None, "none is named"),
    (lambda sp, d: sp.update(kind="draft", proposer="target", max_ngram=3), f"{SP}.max_ngram",
     3, "prompt-lookup only"),
])
def test_a_bad_prompt_lookup_section_is_refused_naming_the_field(tmp_path, change, field,
                                                                 value, needle):
    folder = tmp_path / "p"
    with_prompt_lookup(resolve_package("tiny_llama").root, folder, 4)
    with pytest.raises(PackageError) as info:
        load_package(_edit(folder, change))
    err = info.value
    assert (err.field, err.value) == (field, value), str(err)
    assert needle in str(err) and err.remedy and err.where


def test_the_section_round_trips_and_other_kinds_leave_its_keys_out(lookup):
    from engines.package.schema import PackageSpec

    for package in (lookup["hybrid_mtp"], resolve_package("tiny_llama_pair")):
        text = package.spec.to_yaml()
        assert PackageSpec.model_validate(yaml.safe_load(text)) == package.spec
    assert "max_ngram" not in resolve_package("tiny_llama_pair").spec.to_yaml()
    assert "proposer" not in yaml.safe_load(lookup["hybrid_mtp"].spec.to_yaml())[
        "decoding"]["speculative"]


# -- the converter --------------------------------------------------------------------------

def test_convert_prompt_lookup_adds_the_section_and_nothing_else(tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    from harness.convert.conversion import convert
    from harness.convert.writer import ConvertOptions
    from suites.convert_support import write_tiny_gguf

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    plain = load_package(convert(gguf).folder)
    result = convert(gguf, prompt_lookup=5)
    package = load_package(result.folder)
    assert result.folder.name.startswith("tiny-dynamic-float32-lookup5-")
    assert package.spec.name == "tiny-dynamic-float32-lookup5"
    assert package.spec.decoding.speculative.model_dump(exclude_defaults=True) == {
        "kind": "prompt-lookup", "max_width": 5, "max_ngram": 3, "min_ngram": 2,
        "rollback": list(plain.spec.state)}
    assert package.spec.components == plain.spec.components
    assert package.spec.state == plain.spec.state
    engine = get_engine_class("ort-cpu")(package)
    prompt = list(package.spec.prompts[0])
    assert speculative_decode(engine, prompt, 8, 5).tokens == \
        greedy_decode(get_engine_class("ort-cpu")(plain), prompt, 8).tokens
    for options in ({"prompt_lookup": 0}, {"prompt_lookup": 17},
                    {"prompt_lookup": 4, "draft_layers": 1}):
        with pytest.raises(InputError) as info:
            ConvertOptions(**options).checked()
        assert info.value.field == "--prompt-lookup"


def test_cli_convert_prompt_lookup_says_what_it_wrote(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    from engines.package.schema import MAX_WIDTH_LIMIT
    from harness.cli import convert as cli_convert
    from harness.cli import main
    from suites.convert_support import write_tiny_gguf
    from suites.support import one_line_error

    assert cli_convert.MAX_WIDTH == MAX_WIDTH_LIMIT  # the CLI's copy of the limit
    monkeypatch.setenv("COLUMNS", "200")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert main(["convert", str(gguf), "-o", str(tmp_path / "p"), "--prompt-lookup", "3"]) == 0
    out = capsys.readouterr().out
    assert "speculative: prompt-lookup, n-grams 3..2 of the sequence, widths 1..3" in out
    for bad in ("0", "17", "two"):
        assert "--prompt-lookup" in one_line_error(capsys, ["convert", str(gguf), "-o",
                                                            str(tmp_path / "q"),
                                                            "--prompt-lookup", bad])


# -- SmolLM2: where it pays and where it does not -------------------------------------------

@pytest.mark.real_checkpoint
def test_smollm2_copies_a_grounded_answer_and_not_a_free_one():
    """ort-cpu, float32, width 8, 16 tokens: the grounded prompt (repeat a paragraph) gets
    more than two tokens a target forward, with greedy's stream; the free one (a story)
    barely more than one."""
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    from engines.shipped_checkpoint import smollm2_path
    from harness.convert.smollm2 import smollm2_lookup_package
    from harness.prompts import read_prompts_file, resolve

    if smollm2_path() is None:
        pytest.skip("the SmolLM2 checkpoint is not installed (make real)")
    package = load_package(smollm2_lookup_package())
    engine = get_engine_class("ort-cpu")(package)
    rates = {}
    for set_name, prompt_name in (("grounded", "repeat_paragraph"),
                                  ("free", "story_lighthouse")):
        source = next(s for s in read_prompts_file(set_name) if s.name == prompt_name)
        ids = resolve(source, package, 16).ids
        result = speculative_decode(engine, ids, 16, 8)
        if set_name == "grounded":
            assert result.tokens == greedy_decode(engine, ids, 16).tokens
        led = result.ledger
        rates[set_name] = (len(result.tokens) - 1) / (led.forwards["verify"]
                                                      + led.forwards["decode"])
    print(f"smollm2 prompt lookup w8, tokens a target forward: {rates}")
    assert rates["grounded"] > 2.0 and rates["free"] < 1.5
