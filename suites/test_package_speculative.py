"""The speculative section of package format v1: what loads, and every contradiction refused
with a PackageError naming the field, the value and the remedy."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from engines.errors import PackageError
from engines.package import load_package
from engines.package.schema import PackageSpec
from harness.catalog import builtin


@pytest.fixture(scope="module")
def built():
    return {name: builtin.build(name) for name in ("lookup_chained", "tiny_llama_pair")}


def copy_of(built, name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(built[name], folder)
    return folder


def edit(folder: Path, change) -> Path:
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def spec_of(doc: dict) -> dict:
    return doc["decoding"]["speculative"]


def test_chained_section_loads_with_its_borrow_carry_and_embedding(built):
    sp = load_package(built["lookup_chained"]).spec.decoding.speculative
    assert (sp.kind, sp.proposer, sp.target, sp.max_width) == ("chained", "drafter", "target", 4)
    assert sp.borrows == {"past_key_0": "k0"}
    assert (sp.carry.input, sp.carry.output, sp.carry.seed) == (None, "carry_out", "hidden")
    assert sp.fused_input == "embeddings" and sp.embedding.scale == 2.0
    assert sp.rollback == ["k0"] and sp.snapshot == []


def test_draft_section_defaults_rollback_to_every_target_kv_cell(built, tmp_path):
    folder = edit(copy_of(built, "tiny_llama_pair", tmp_path), lambda d: spec_of(d).pop("rollback"))
    spec = load_package(folder).spec
    assert spec.decoding.speculative.rollback is None
    assert spec.rollback_cells() == ["k0", "v0", "k1", "v1"]


def test_spec_round_trips_through_yaml(built):
    spec = load_package(built["lookup_chained"]).spec
    again = PackageSpec.model_validate(yaml.safe_load(spec.to_yaml()))
    assert again == spec


@dataclass(frozen=True)
class Bad:
    id: str
    fixture: str
    change: object
    field: str
    value: object
    needles: tuple[str, ...]


def _set(key, value):
    def change(doc):
        spec_of(doc)[key] = value
    return change


def _carry(**values):
    def change(doc):
        spec_of(doc)["carry"].update(values)
    return change


def _drop(key):
    def change(doc):
        spec_of(doc).pop(key)
    return change


SP = "decoding.speculative"
CASES = [
    Bad("width-zero", "lookup_chained", _set("max_width", 0), f"{SP}.max_width", 0,
        ("must be >= 1",)),
    Bad("width-over-limit", "lookup_chained", _set("max_width", 99), f"{SP}.max_width", 99,
        ("must be <= 16",)),
    Bad("fused-without-embedding", "lookup_chained", _drop("embedding"), f"{SP}.embedding",
        None, ("needs a token table", "add embedding")),
    Bad("chained-without-carry", "lookup_chained", _drop("carry"), f"{SP}.carry", None,
        ("no carry (and so no carry seed)", "seed:")),
    Bad("seed-not-a-target-output", "lookup_chained", _carry(seed="cache_read"),
        f"{SP}.carry.seed", "cache_read",
        ("not a declared output role of the target", "logits, hidden")),
    Bad("borrow-unknown-cell", "lookup_chained", _set("borrows", {"past_key_0": "k9"}),
        f"{SP}.borrows.past_key_0", "k9", ("does not declare", "k0")),
    Bad("borrow-cell-owned-by-the-drafter", "tiny_llama_pair",
        _set("borrows", {"extra_past": "d_k0"}), f"{SP}.borrows.extra_past", "d_k0",
        ("component 'drafter' owns", "not the target", "target's cells: k0")),
    Bad("borrowed-port-not-in-graph", "lookup_chained", _set("borrows", {"past_kee": "k0"}),
        "components.drafter.inputs", "past_key_0",
        ("bound to no role", "decoding.speculative.borrows")),
    Bad("snapshot-a-kv-cell", "lookup_chained", _set("snapshot", ["k0"]), f"{SP}.snapshot[0]",
        "k0", ("is a kv cell", "recurrent cells only")),
    Bad("rollback-unknown-cell", "lookup_chained", _set("rollback", ["r0"]), f"{SP}.rollback[0]",
        "r0", ("not a declared cell", "kv cells only: k0")),
    Bad("rollback-a-drafter-cell", "tiny_llama_pair", _set("rollback", ["d_k0"]),
        f"{SP}.rollback[0]", "d_k0", ("owned by 'drafter'",)),
    Bad("rollback-leaves-a-kv-cell-out", "tiny_llama_pair", _set("rollback", ["k0", "v0"]),
        f"{SP}.rollback", ["k0", "v0"], ("k1, v1 would keep rejected positions",)),
    Bad("draft-with-a-carry", "tiny_llama_pair",
        _set("carry", {"output": "hidden", "seed": "hidden"}), f"{SP}.carry",
        {"input": None, "output": "hidden", "seed": "hidden"}, ("keeps its own state cells",)),
    Bad("unknown-proposer", "lookup_chained", _set("proposer", "drafer"), f"{SP}.proposer",
        "drafer", ("not a declared component", "target, drafter")),
    Bad("proposer-is-the-target", "lookup_chained", _set("proposer", "target"),
        f"{SP}.proposer", "target", ("same component",)),
    Bad("embedding-initializer-missing", "lookup_chained",
        _set("embedding", {"component": "drafter", "initializer": "embed", "scale": 1.0}),
        f"{SP}.embedding.initializer", "embed", ("has no initializer 'embed'",)),
    Bad("embedding-is-not-a-token-table", "lookup_chained",
        _set("embedding", {"component": "target", "initializer": "key_position_0"}),
        f"{SP}.embedding.initializer", "key_position_0", ("[64, 4]", "[vocab_size=32, width]")),
    Bad("fused-input-width-mismatch", "lookup_chained",
        _set("embedding", {"component": "drafter", "initializer": "carry_table_0"}),
        f"{SP}.fused_input", "embeddings", ("40 wide", "(8) plus the carry seed 'hidden' (8)")),
    Bad("carry-input-when-fused", "lookup_chained", _carry(input="fused_in"),
        f"{SP}.carry.input", "fused_in", ("travels inside the fused input",)),
    Bad("unknown-kind", "lookup_chained", _set("kind", "medusa"), f"{SP}.kind", "medusa",
        ("not one of the allowed values", "draft", "chained", "mtp")),
    Bad("no-kind", "lookup_chained", _drop("kind"), SP, None,
        ("no kind", "speculative: null")),
    Bad("unknown-field", "lookup_chained", _set("widht", 3), f"{SP}.widht", 3,
        ("unknown field",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_contradictions_are_refused_naming_field_value_and_remedy(built, tmp_path, case: Bad):
    folder = edit(copy_of(built, case.fixture, tmp_path), case.change)
    with pytest.raises(PackageError) as info:
        load_package(folder)
    err = info.value
    text = str(err)
    assert err.field == case.field, text
    if case.id != "no-kind":
        assert err.value == case.value, text
    for needle in case.needles:
        assert needle in text, f"{needle!r} not in: {text}"
    assert err.remedy and err.where, text
