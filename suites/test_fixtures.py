"""The fixture packages: they build, validate, are deterministic, well-conditioned, use only
the executor's ops with host-resolvable shapes, and their caches mean what they say."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given

from engines.oracle import oracle_decode
from engines.package import load_package
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from harness.catalog import builtin, lookup_chained
from harness.catalog.conditioning import ConditioningError, choose_seed, measure
from harness.convert.onnx_graph import ALLOWED_OPS, IR_VERSION, OPSET
from harness.convert.llama_config import LlamaConfig
from harness.convert.llama_graph import build_llama
from harness.convert.package_writer import content_hash, read_build_info
from fixtures.strategies import build_generated, decoder_configs
from harness.cli import main

NAMES = list(builtin.FIXTURES)
NEW = 32


@pytest.fixture(scope="module")
def built():
    """The built-in fixtures in the shared cache (built once, only read here)."""
    return {name: builtin.build(name) for name in NAMES}


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A cache of this test's own, for tests that build, force or compare builds."""
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def session_for(folder, component="target", path=None):
    pkg = load_package(folder)
    return ort.InferenceSession(str(path or pkg.component_path(component)),
                                providers=["CPUExecutionProvider"]), pkg.spec


def zero_state(spec, component="target"):
    return {c.input: np.zeros(c.shape, dtype=c.dtype) for c in spec.state_of(component).values()}


def forward(session, spec, tokens, start, state):
    """One target forward over ``tokens`` at positions start.. with ``state`` (graph names)."""
    comp = spec.components["target"]
    feeds = {comp.inputs["tokens"]: np.asarray([tokens], dtype=np.int64),
             comp.inputs["positions"]: np.arange(start, start + len(tokens))[None], **state}
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, feeds)))
    new_state = {c.input: out[c.output] for c in spec.state_of("target").values()}
    return out, new_state


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-30))


# -- build, validate, cache -------------------------------------------------------------------

@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("name", NAMES)
def test_builtin_fixture_builds_validates_and_is_well_conditioned(built, name):
    pkg = load_package(built[name])
    info = read_build_info(built[name])
    threshold = tolerance_for(pkg.spec.dtype).near_tie_margin
    assert pkg.spec.name == name and pkg.content_hash == content_hash(built[name])
    assert info["seed"] >= builtin.FIXTURES[name].default_seed
    assert info["conditioning"]["min_margin"] >= threshold
    assert [s["prompt"] for s in info["conditioning"]["streams"]] == pkg.spec.prompts
    for prompt in pkg.spec.prompts:
        assert 3 <= len(prompt) <= 8


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic_and_seeded(private_cache, monkeypatch, tmp_path, name):
    first = content_hash(builtin.build(name))
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "second"))
    again = builtin.build(name)
    assert content_hash(again) == first
    other = builtin.build(name, seed=builtin.FIXTURES[name].default_seed + 1)
    assert content_hash(other) != first


def test_build_reuses_the_cache_and_force_rebuilds(private_cache):
    folder = builtin.build("lookup_chained")
    assert folder.parent == private_cache
    stamp = (folder / "package.yaml").stat().st_mtime_ns
    inode = os.stat(folder).st_ino
    assert builtin.build("lookup_chained") == folder
    assert (folder / "package.yaml").stat().st_mtime_ns == stamp
    assert builtin.build("lookup_chained", force=True) == folder
    assert os.stat(folder).st_ino != inode or (folder / "package.yaml").stat().st_mtime_ns != stamp
    assert not [p for p in private_cache.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_build_by_other_builder_code_is_stale_and_rebuilt(private_cache):
    folder = builtin.build("lookup_chained")
    (private_cache / "lookup_chained-0.recipe").write_text("an older builder\n")
    status = {s.name: s for s in builtin.list_fixtures()}["lookup_chained"]
    assert status.built and not status.current
    (folder / "marker").write_text("from the stale build")
    assert builtin.build("lookup_chained") == folder
    assert not (folder / "marker").exists()
    assert {s.name: s for s in builtin.list_fixtures()}["lookup_chained"].current


def test_unknown_fixture_is_a_clear_error():
    from engines.errors import InputError

    with pytest.raises(InputError) as err:
        builtin.build("tiny_lama")
    assert err.value.field == "name" and "tiny_llama" in err.value.remedy


# -- graphs stay inside the executor's contract -----------------------------------------------

SHAPE_ARGS = {"Reshape": [1], "Slice": [1, 2, 3, 4], "Unsqueeze": [1], "Squeeze": [1],
              "Expand": [1], "Range": [0, 1, 2], "ReduceMean": [1], "ReduceSum": [1],
              "ReduceMax": [1], "Split": [1], "Trilu": [1]}


def check_graph_contract(model: onnx.ModelProto, dtype: str) -> None:
    assert model.ir_version == IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    host = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT64}
    for node in model.graph.node:
        assert node.op_type in ALLOWED_OPS, node.op_type
        assert not (node.op_type == "Cast" and dtype == "float32"), node.name
        for i in SHAPE_ARGS.get(node.op_type, []):
            if i < len(node.input) and node.input[i]:
                assert node.input[i] in host, f"{node.name}: {node.input[i]} is a device value"
        if node.op_type in ("Constant", "Shape") or (
                node.input and all(x in host for x in node.input)):
            host.update(node.output)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_graphs_use_only_supported_ops_and_host_shapes(built, name):
    pkg = load_package(built[name])
    for comp in pkg.spec.components:
        check_graph_contract(pkg.component_model(comp), pkg.spec.dtype)
    if name == "lookup_chained":
        check_graph_contract(onnx.load(built[name] / lookup_chained.DRAFTER_FILE), "float32")


# -- lookup_chained ---------------------------------------------------------------------------

@pytest.mark.claim("token_identity")
def test_lookup_chained_oracle_equals_the_analytic_stream(built):
    pkg = load_package(built["lookup_chained"])
    for prompt in pkg.spec.prompts:
        expected = lookup_chained.analytic_greedy(prompt, NEW)
        assert oracle_decode(pkg, prompt, NEW).tokens == expected
        assert len(set(expected)) == NEW  # full period: never constant, never a short cycle


@pytest.mark.claim("logits_within_tolerance")
def test_lookup_chained_target_reads_its_cache(built):
    session, spec = session_for(built["lookup_chained"])
    prompt = spec.prompts[2]
    full, _ = forward(session, spec, prompt, 0, zero_state(spec))
    _, cache = forward(session, spec, prompt[:-1], 0, zero_state(spec))
    step, _ = forward(session, spec, prompt[-1:], len(prompt) - 1, cache)
    tol = tolerance_for(spec.dtype)
    np.testing.assert_allclose(step["logits"][0, -1], full["logits"][0, -1], atol=tol.max_abs)
    assert (cache["past_key_0"] != 0).all()
    stale = {k: v[:, :, :-1] for k, v in cache.items()}       # missing the latest position
    other_prompt = [(t + 5) % lookup_chained.VOCAB for t in prompt[:-1]]
    _, wrong = forward(session, spec, other_prompt, 0, zero_state(spec))
    for bad in (stale, wrong, zero_state(spec)):
        out, _ = forward(session, spec, prompt[-1:], len(prompt) - 1, bad)
        assert abs(out["cache_read"][0, 0] - step["cache_read"][0, 0]) > 100 * tol.max_abs
        assert np.abs(out["logits"] - step["logits"]).max() > 10 * tol.max_abs
        assert out["logits"][0, -1].argmax() == lookup_chained.next_token(prompt[-1])


def test_lookup_chained_drafter_borrows_the_target_cache(built):
    """The chained drafter's answer depends on the borrowed cache and on the carry half of
    its fused input (the rule in closed form: ``lookup_chained.draft_next_token``)."""
    folder = built["lookup_chained"]
    target, spec = session_for(folder)
    drafter, _ = session_for(folder, component="drafter")
    prompt = [1, 3, 7, 11, 12]
    out, cache = forward(target, spec, prompt, 0, zero_state(spec))
    key = cache["past_key_0"]
    token = prompt[-1]

    def draft(carry0: float, borrowed) -> int:
        fused = np.zeros((1, 1, lookup_chained.VOCAB + lookup_chained.HIDDEN), np.float32)
        fused[0, 0, token] = 1.0  # the scaled embedding is one-hot
        fused[0, 0, lookup_chained.VOCAB:] = out["hidden"][0, -2]
        fused[0, 0, lookup_chained.VOCAB] = carry0
        logits = drafter.run(["logits"], {"fused_in": fused, "past_key_0": borrowed})[0]
        return int(logits[0, -1].argmax())

    kv_sign = float(np.sign(key[0, 0, -1, 0]))
    for carry0 in (-0.7, 0.7):
        assert draft(carry0, key) == lookup_chained.draft_next_token(token, kv_sign, carry0)
        flipped = key.copy()
        flipped[0, 0, -1, 0] *= -1  # the last key's channel 0 flips the cache feature
        assert draft(carry0, flipped) == lookup_chained.draft_next_token(token, -kv_sign, carry0)
        empty = np.zeros((1, 1, 0, lookup_chained.KV_WIDTH), np.float32)  # the seed cache
        assert draft(carry0, empty) == lookup_chained.next_token(token)
    assert lookup_chained.wrong_draft(token) != lookup_chained.next_token(token)


def test_lookup_chained_margin_is_planted(tmp_path):
    for margin in (3.0, 0.5):
        folder = lookup_chained.build_lookup_chained(tmp_path / f"m{margin}", 5, margin=margin)
        report = measure(folder)
        # the cache bump moves the gap by at most margin / 4 and never flips the argmax
        assert 0.75 * margin <= report.min_margin <= 1.25 * margin
        assert all(t.tokens == lookup_chained.analytic_greedy(t.prompt, len(t.tokens))
                   for t in report.trajectories)


# -- conditioning -----------------------------------------------------------------------------

def plant(margin_for_seed):
    def build(folder, seed):
        return lookup_chained.build_lookup_chained(folder, seed, margin=margin_for_seed(seed))
    return build


def test_conditioning_rejects_a_planted_near_tie(tmp_path):
    threshold = tolerance_for("float32").near_tie_margin
    folder = lookup_chained.build_lookup_chained(tmp_path / "near", 0, margin=threshold / 2)
    report = measure(folder)
    assert not report.ok and report.min_margin < threshold
    assert "near-tie margin" in report.problems[0]
    with pytest.raises(ConditioningError) as err:
        choose_seed(plant(lambda seed: threshold / 2), tmp_path / "all", 0, max_tries=3)
    assert err.value.field == "seed" and "0..2" in str(err.value)


def test_conditioning_moves_past_a_bad_seed_and_accepts_the_default(tmp_path):
    threshold = tolerance_for("float32").near_tie_margin
    build = plant(lambda seed: threshold / 3 if seed == 10 else lookup_chained.DEFAULT_MARGIN)
    chosen, report, rejected = choose_seed(build, tmp_path / "pkg", 10)
    assert chosen == 11 and report.ok and [r["seed"] for r in rejected] == [10]
    assert rejected[0]["min_margin"] < threshold


def test_conditioning_rejects_a_collapsed_stream(tmp_path):
    # a random tied-head decoder echoes its input: a constant stream, whatever the margins
    config = dataclasses.replace(builtin.TINY_LLAMA, tied=True, seed=0)
    report = measure(build_llama(tmp_path / "tied", config, builtin.TINY_LLAMA_PROMPTS))
    assert not report.ok and any("degenerate" in p for p in report.problems)


# -- tiny_llama -------------------------------------------------------------------------------

@pytest.mark.claim("token_identity")
def test_tiny_llama_append_and_static_share_weights_and_streams(built):
    append, static = (load_package(built[n]) for n in ("tiny_llama", "tiny_llama_static"))
    assert read_build_info(built["tiny_llama"])["seed"] == \
        read_build_info(built["tiny_llama_static"])["seed"]
    for prompt in append.spec.prompts:
        a, s = oracle_decode(append, prompt, NEW), oracle_decode(static, prompt, NEW)
        assert a.tokens == s.tokens
        assert len(set(a.tokens[NEW // 2:])) >= 4
        np.testing.assert_allclose(a.margins, s.margins, atol=tolerance_for("float32").max_abs)


def chunked_logits(folder, prompt, chunks):
    """Logits of every position, computed over consecutive chunks that thread the cache."""
    session, spec = session_for(folder)
    state, start, rows = zero_state(spec), 0, []
    for size in chunks:
        out, new_state = forward(session, spec, prompt[start:start + size], start, state)
        for name, old in state.items():
            cell = next(c for c in spec.state.values() if c.input == name)
            if cell.update == "static":
                assert new_state[name].shape == old.shape
            else:
                assert new_state[name].shape[2] == old.shape[2] + size
        state, start = new_state, start + size
        rows.append(out["logits"][0])
    return np.concatenate(rows)


@pytest.mark.claim("logits_within_tolerance")
@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama_static"])
def test_tiny_llama_any_chunking_matches_one_forward(built, name):
    prompt = [1, 60, 3, 88, 23, 9, 71, 4, 40, 2]
    whole = chunked_logits(built[name], prompt, [len(prompt)])
    for chunks in ([1] * len(prompt), [3, 1, 4, 2], [6, 4]):
        np.testing.assert_allclose(chunked_logits(built[name], prompt, chunks), whole,
                                   atol=tolerance_for("float32").max_abs, rtol=0)


def test_llama_config_rejects_bad_grouping():
    from engines.errors import InputError

    with pytest.raises(InputError) as err:
        LlamaConfig(heads=4, kv_heads=3)
    assert err.value.field == "kv_heads"


# -- generated decoders -----------------------------------------------------------------------

@pytest.mark.claim("logits_within_tolerance", "finite_logits")
@given(decoder_configs())
def test_generated_decoders_validate_and_agree_across_cache_kinds(tmp_path_factory, case):
    root = tmp_path_factory.mktemp("generated")
    prompt = list(case.prompt) + [(t * 7 + 1) % case.config.vocab for t in case.prompt][:4]
    logits = {}
    for kind in ("append", "static"):
        variant = case.with_cache(kind)
        folder = build_generated(variant, root / kind)
        pkg = load_package(folder)
        assert pkg.spec.dtype == case.config.dtype and pkg.spec.prompts == [list(case.prompt)]
        check_graph_contract(pkg.component_model("target"), case.config.dtype)
        split = max(1, len(prompt) // 2)
        logits[kind] = chunked_logits(folder, prompt, [split, len(prompt) - split])
        whole = chunked_logits(folder, prompt, [len(prompt)])
        assert np.isfinite(whole).all()
        assert nmse(logits[kind], whole) <= tolerance_for(case.config.dtype).nmse
    assert nmse(logits["static"], logits["append"]) <= tolerance_for(case.config.dtype).nmse


# -- CLI --------------------------------------------------------------------------------------

def test_cli_build_and_list(private_cache, capsys):
    assert main(["fixtures", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in NAMES) and "yes" not in listed
    assert main(["fixtures", "build", "lookup_chained"]) == 0
    assert "lookup_chained" in capsys.readouterr().out
    assert (private_cache / "lookup_chained-0" / "package.yaml").is_file()
    assert not (private_cache / "tiny_llama-67").exists()
    assert main(["fixtures", "list"]) == 0
    assert "yes" in capsys.readouterr().out
    assert main(["fixtures", "build", "lookup_chained", "--force"]) == 0


def test_cli_unknown_fixture_exits_2(private_cache, capsys):
    assert main(["fixtures", "build", "lookup_chained", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "tiny_llama" in err
    assert not private_cache.exists() or not any(private_cache.iterdir())


# -- tied_llama -------------------------------------------------------------------------------

TIED_STEPS = 16


def bitwise_pairs_equal(rows) -> bool:
    """Whether ids 2k and 2k+1 hold the bitwise-same value in every row of ``rows``."""
    rows = np.ascontiguousarray(rows)
    bits = rows.view(np.uint32 if rows.dtype == np.float32 else np.uint64)
    return bool(np.array_equal(bits[..., 0::2], bits[..., 1::2]))


def prefix_rows(engine, spec, prompt, tokens) -> np.ndarray:
    """The oracle's view: for each step, the last logits row of a from-scratch forward over
    prompt + the tokens before that step, in the package dtype."""
    comp = spec.components["target"]
    rows = []
    for t in range(len(tokens)):
        seq = list(prompt) + list(tokens[:t])
        feeds = {comp.inputs["tokens"]: np.asarray([seq], dtype=np.int64),
                 comp.inputs["positions"]: np.arange(len(seq), dtype=np.int64)[None],
                 **zero_state(spec)}
        logits = np.asarray(engine.run_component("target", feeds)[comp.outputs["logits"]])
        rows.append(logits[0, -1])
    return np.stack(rows)


@pytest.fixture(scope="module")
def tied_engines(built):
    from engines.registry import get_engine_class
    from suites.support import HOST_ENGINES

    pkg = load_package(built["tied_llama"])
    engines = {name: get_engine_class(name)(pkg) for name in HOST_ENGINES}
    yield pkg, engines
    for engine in engines.values():
        engine.close()


def test_tied_llama_is_declared_and_its_build_record_counts_every_step_tied(built):
    fixture = builtin.FIXTURES["tied_llama"]
    assert fixture.tie_group == 2 and fixture.max_width == 0
    assert builtin.FIXTURES["tiny_llama"].tie_group == 1
    info = read_build_info(built["tied_llama"])
    cond = info["conditioning"]
    streams = cond["streams"]
    assert cond["tie_group"] == 2
    assert cond["tied_steps"] == cond["steps"] == sum(len(s["tokens"]) for s in streams)
    assert all(s["tied_steps"] == len(s["tokens"]) for s in streams)
    assert cond["min_margin"] >= tolerance_for("float32").near_tie_margin
    assert all(t % 2 == 0 for s in streams for t in s["tokens"])
    assert "tie_group" not in read_build_info(built["tiny_llama"])["conditioning"]
    pkg = load_package(built["tied_llama"])
    assert pkg.spec.decoding.speculative is None and pkg.spec.vocab_size == 96


@pytest.mark.claim("token_identity")
def test_tied_llama_oracle_logits_tie_in_pairs_on_every_engine(tied_engines):
    """At every step the from-scratch prefix logits hold ids 2k and 2k+1 bitwise equal, on each
    host engine, and the oracle names the even twin best and the odd one runner-up at margin 0."""
    pkg, engines = tied_engines
    for prompt in pkg.spec.prompts:
        oracle = oracle_decode(pkg, prompt, TIED_STEPS)
        assert len(oracle.tokens) == TIED_STEPS
        assert oracle.margins == [0.0] * TIED_STEPS
        assert oracle.top2 == [(t, t + 1) for t in oracle.tokens]
        for name, engine in engines.items():
            rows = prefix_rows(engine, pkg.spec, prompt, oracle.tokens)
            assert rows.dtype == np.float32, name
            assert bitwise_pairs_equal(rows), f"{name}: a logit pair differs on {prompt}"
            assert [int(r.argmax()) for r in rows] == oracle.tokens, name
            # the best logit outside the tied pair is a clear step below it
            third = np.sort(rows.astype(np.float64), axis=-1)[:, -3]
            assert (rows.max(-1) - third >= tolerance_for("float32").near_tie_margin).all()


@pytest.mark.claim("token_identity")
def test_tied_llama_every_engine_emits_the_even_twin_and_the_same_stream(tied_engines):
    pkg, engines = tied_engines
    for prompt in pkg.spec.prompts:
        oracle = oracle_decode(pkg, prompt, TIED_STEPS)
        streams = {}
        for name, engine in engines.items():
            result = greedy_decode(engine, prompt, TIED_STEPS, audit=True)
            assert all(t % 2 == 0 for t in result.tokens), f"{name} chose an odd twin"
            assert bitwise_pairs_equal(np.stack(result.logits)), name  # cached steps tie too
            streams[name] = result.tokens
        assert len(set(map(tuple, streams.values()))) == 1, streams
        assert streams["ort-cpu"] == oracle.tokens


def test_tied_llama_measured_tied_steps_match_the_build_record(built):
    report = measure(built["tied_llama"], tie_group=2)
    cond = read_build_info(built["tied_llama"])["conditioning"]
    assert report.ok and report.steps == cond["steps"] == report.tied_steps == cond["tied_steps"]
    assert round(report.min_margin, 4) == cond["min_margin"]


def test_conditioning_needs_the_tie_group_and_the_ties(built, tmp_path):
    """A paired head measured as an ordinary fixture is all near-ties; an ordinary decoder
    measured with a tie group of 2 is never tied: both are rejected, each for its reason."""
    paired = dataclasses.replace(builtin.TIED_LLAMA, seed=builtin.TIED_LLAMA_SEED)
    folder = build_llama(tmp_path / "paired", paired, builtin.TINY_LLAMA_PROMPTS)
    plain = measure(folder)
    assert not plain.ok and plain.min_margin == 0.0
    assert all("near-tie margin" in p for p in plain.problems)
    untied = measure(built["tiny_llama"], tie_group=2)
    assert not untied.ok and untied.tied_steps == 0
    assert all("not exactly tied" in p for p in untied.problems)


def test_llama_config_rejects_a_paired_head_it_cannot_build():
    from engines.errors import InputError

    for bad in ({"tied": True}, {"vocab": 95}):
        with pytest.raises(InputError) as err:
            LlamaConfig(paired_head=True, **bad)
        assert err.value.field == "paired_head"
