"""Package format v1: a valid package loads and round-trips; each malformed package fails with
its own error naming the file, the field path, the bad value and the remedy; the content hash
follows the bytes and nothing else.

The ONNX models are built here with onnx.helper (opset 18, IR 8), so the suite depends on
no fixture builder.
"""
from __future__ import annotations

import copy
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
import yaml
from hypothesis import assume, given, strategies as st
from onnx import TensorProto, helper, numpy_helper

from engines.errors import InputError, PackageError
from engines.package import (PackageSpec, load_package, package_content_hash, read_spec)

VOCAB, HIDDEN, HEADS, HEAD_DIM, RECURRENT, MAX_CONTEXT = 96, 8, 2, 8, 16, 64


# -- a small, real component -------------------------------------------------------------------
def build_target(*, tokens_type: int = TensorProto.INT64, float_type: int = TensorProto.FLOAT,
                 logits_width: int | str = VOCAB, kv_seq: int | str = "past",
                 extra_input: bool = False) -> onnx.ModelProto:
    """A decoder-shaped graph: tokens + positions in; logits, hidden, an append KV cache and a
    recurrent cell out. Weights are random but fixed; the graph passes onnx.checker."""
    rng = np.random.default_rng(7)
    np_float = helper.tensor_dtype_to_np_dtype(float_type)
    w_logits = numpy_helper.from_array(rng.standard_normal((1, VOCAB)).astype(np_float), "w_logits")
    w_hidden = numpy_helper.from_array(rng.standard_normal((1, HIDDEN)).astype(np_float), "w_hidden")
    bump = numpy_helper.from_array(np.ones((1, RECURRENT), np_float), "bump")
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes2")
    axes1 = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=float_type),
        helper.make_node("Cast", ["position_ids"], ["pos_f"], to=float_type),
        helper.make_node("Add", ["ids_f", "pos_f"], ["mixed"]),
        helper.make_node("Unsqueeze", ["mixed", "axes2"], ["col"]),
        helper.make_node("MatMul", ["col", "w_logits"], ["logits"]),
        helper.make_node("MatMul", ["col", "w_hidden"], ["hidden"]),
        helper.make_node("Unsqueeze", ["hidden", "axes1"], ["head"]),
        helper.make_node("Concat", ["head", "head"], ["new_kv"], axis=1),
        helper.make_node("Concat", ["past_key_0", "new_kv"], ["present_key_0"], axis=2),
        helper.make_node("Add", ["state_in", "bump"], ["state_out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", tokens_type, [1, "M"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "M"]),
        helper.make_tensor_value_info("past_key_0", float_type, [1, HEADS, kv_seq, HEAD_DIM]),
        helper.make_tensor_value_info("state_in", float_type, [1, RECURRENT]),
    ]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                    [1, "M"]))
    outputs = [
        helper.make_tensor_value_info("logits", float_type, [1, "M", logits_width]),
        helper.make_tensor_value_info("hidden", float_type, [1, "M", HIDDEN]),
        helper.make_tensor_value_info("present_key_0", float_type,
                                      [1, HEADS, "total", HEAD_DIM]),
        helper.make_tensor_value_info("state_out", float_type, [1, RECURRENT]),
    ]
    graph = helper.make_graph(nodes, "target", inputs, outputs,
                              initializer=[w_logits, w_hidden, bump, axes, axes1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def base_doc() -> dict:
    return {
        "format": 1,
        "name": "tiny_llama",
        "description": "random-weight decoder with one append kv cell and one recurrent cell",
        "vocab_size": VOCAB,
        "bos_id": 1,
        "eos_id": None,
        "max_context": MAX_CONTEXT,
        "dtype": "float32",
        "tokenizer": None,
        "prompts": [[1, 17, 42, 5], [1, 3]],
        "components": {
            "target": {
                "path": "target.onnx",
                "inputs": {"tokens": "input_ids", "positions": "position_ids"},
                "outputs": {"logits": "logits", "hidden": "hidden"},
            },
        },
        "state": {
            "k0": {"kind": "kv", "component": "target", "input": "past_key_0",
                   "output": "present_key_0", "dtype": "float32",
                   "shape": [1, HEADS, 0, HEAD_DIM], "seq_axis": 2, "update": "append"},
            "r0": {"kind": "recurrent", "component": "target", "input": "state_in",
                   "output": "state_out", "dtype": "float32", "shape": [1, RECURRENT]},
        },
        "decoding": {"greedy": {}, "speculative": None},
    }


@dataclass
class Pkg:
    """A package under construction: edit ``doc``/``models``/``yaml_text``, then ``write``."""
    folder: Path
    doc: dict = field(default_factory=base_doc)
    models: dict[str, onnx.ModelProto] = field(default_factory=lambda: {"target.onnx":
                                                                         build_target()})
    yaml_text: str | None = None
    write_yaml: bool = True

    @property
    def yaml_path(self) -> Path:
        return self.folder / "package.yaml"

    def write(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        for rel, model in self.models.items():
            onnx.save(model, str(self.folder / rel))
        if self.write_yaml:
            text = self.yaml_text if self.yaml_text is not None else yaml.safe_dump(
                self.doc, sort_keys=False, default_flow_style=None)
            self.yaml_path.write_text(text)
        return self.folder


@pytest.fixture
def pkg(tmp_path: Path) -> Pkg:
    return Pkg(tmp_path / "pkg")


# -- a valid package ---------------------------------------------------------------------------
def test_builder_model_is_a_valid_onnx_model():
    onnx.checker.check_model(build_target(), full_check=True)


def test_valid_package_loads(pkg: Pkg):
    root = pkg.write()
    package = load_package(root)
    assert package.root == root.resolve()
    assert package.spec.name == "tiny_llama"
    assert package.spec.vocab_size == VOCAB
    assert package.spec.prompts == [[1, 17, 42, 5], [1, 3]]
    assert package.spec.components["target"].inputs == {"tokens": "input_ids",
                                                        "positions": "position_ids"}
    assert package.spec.state["k0"].update == "append"
    assert package.spec.state["r0"].seq_axis is None
    assert package.component_path("target") == root.resolve() / "target.onnx"
    assert package.graph_inputs("target") == ("input_ids", "position_ids", "past_key_0",
                                              "state_in")
    assert package.graph_outputs("target") == ("logits", "hidden", "present_key_0",
                                               "state_out")
    assert list(package.state_of("target")) == ["k0", "r0"]
    model = package.component_model("target")
    assert isinstance(model, onnx.ModelProto)
    assert model is package.component_model("target")  # loaded once, cached
    assert model.graph == build_target().graph
    assert package.content_hash == package_content_hash(root)


def test_loading_through_package_yaml_equals_loading_the_folder(pkg: Pkg):
    root = pkg.write()
    a, b = load_package(root), load_package(root / "package.yaml")
    assert a.spec == b.spec and a.root == b.root and a.content_hash == b.content_hash


def test_optional_fields_take_their_defaults(pkg: Pkg):
    for key in ("bos_id", "eos_id", "tokenizer", "decoding"):
        del pkg.doc[key]
    spec = load_package(pkg.write()).spec
    assert spec.bos_id is None and spec.eos_id is None and spec.tokenizer is None
    assert spec.decoding.speculative is None and spec.decoding.greedy.model_dump() == {}


def test_spec_round_trips_through_yaml_and_dict(pkg: Pkg, tmp_path: Path):
    first = load_package(pkg.write())
    assert PackageSpec.model_validate(first.spec.model_dump()) == first.spec
    again = Pkg(tmp_path / "again", yaml_text=first.spec.to_yaml())
    second = load_package(again.write())
    assert second.spec == first.spec
    assert yaml.safe_load(first.spec.to_yaml()) == yaml.safe_load(second.spec.to_yaml())


def test_static_kv_cell_with_max_context_extent_loads(pkg: Pkg):
    pkg.models["target.onnx"] = build_target(kv_seq=MAX_CONTEXT)
    pkg.doc["state"]["k0"].update(update="static", shape=[1, HEADS, MAX_CONTEXT, HEAD_DIM])
    assert load_package(pkg.write()).spec.state["k0"].update == "static"


def test_tokenizer_path_resolves_inside_the_package(pkg: Pkg):
    pkg.doc["tokenizer"] = {"kind": "huggingface", "path": "tokenizer.json"}
    root = pkg.write()
    (root / "tokenizer.json").write_text("{}")
    assert load_package(root).tokenizer_path == root.resolve() / "tokenizer.json"


def test_external_data_is_resolved_inside_the_package(pkg: Pkg):
    root = pkg.write()
    original = build_target()
    onnx.save_model(copy.deepcopy(original), str(root / "target.onnx"),
                    save_as_external_data=True, all_tensors_to_one_file=True,
                    location="target.weights", size_threshold=0)
    assert (root / "target.weights").stat().st_size > 0
    package = load_package(root)
    weights = {t.name: numpy_helper.to_array(t)
               for t in package.component_model("target").graph.initializer}
    for tensor in original.graph.initializer:
        np.testing.assert_array_equal(weights[tensor.name], numpy_helper.to_array(tensor))


def test_unknown_component_is_an_input_error_listing_the_components(pkg: Pkg):
    package = load_package(pkg.write())
    with pytest.raises(InputError) as info:
        package.component_model("targt")
    assert info.value.value == "targt"
    assert "use one of: target" in str(info.value) and "did you mean 'target'" in str(info.value)


# -- malformed packages: one row each ----------------------------------------------------------
@dataclass(frozen=True)
class Bad:
    id: str
    mutate: Callable[[Pkg], None]
    field: str | None
    value: object
    needles: tuple[str, ...]  # substrings of str(err): message and remedy
    where: str = "yaml"  # which file the error's location names: yaml | onnx | outside


def _set(path: str, value) -> Callable[[Pkg], None]:
    """Mutation: set a dotted path in the document (``-`` as value deletes the key)."""
    def mutate(p: Pkg) -> None:
        *parents, last = path.split(".")
        node = p.doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value == "-":
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


def _both(*mutations: Callable[[Pkg], None]) -> Callable[[Pkg], None]:
    def mutate(p: Pkg) -> None:
        for m in mutations:
            m(p)
    return mutate


def _no_yaml(p: Pkg) -> None:
    p.write_yaml = False


def _bad_syntax(p: Pkg) -> None:
    p.yaml_text = "format: 1\nname: tiny\ncomponents:\n  target:\n    path: [target.onnx\n"


def _model(**kwargs) -> Callable[[Pkg], None]:
    def mutate(p: Pkg) -> None:
        p.models["target.onnx"] = build_target(**kwargs)
    return mutate


def _outside_file(p: Pkg) -> Path:
    outside = p.folder.parent / "x.onnx"
    outside.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build_target(), str(outside))
    return outside


def _traversal(p: Pkg) -> None:
    _outside_file(p)
    p.doc["components"]["target"]["path"] = "../x.onnx"


def _absolute(p: Pkg) -> None:
    p.doc["components"]["target"]["path"] = str(_outside_file(p))


def _symlink_escape(p: Pkg) -> None:
    outside = _outside_file(p)
    p.folder.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, p.folder / "linked.onnx")
    p.doc["components"]["target"]["path"] = "linked.onnx"


def _garbage_onnx(p: Pkg) -> None:
    p.models.clear()
    p.folder.mkdir(parents=True, exist_ok=True)
    (p.folder / "target.onnx").write_bytes(b"this is not an onnx model at all")


def _duplicate_key(p: Pkg) -> None:
    text = yaml.safe_dump(p.doc, sort_keys=False, default_flow_style=None)
    p.yaml_text = text.replace("  target:\n", "  target:\n    path: other.onnx\n", 1)


CASES = [
    Bad("missing-package-yaml", _no_yaml, None, "<root>",
        ("is not a package", "no package.yaml", "target.onnx")),
    Bad("yaml-syntax-error", _bad_syntax, None, "path: [target.onnx",
        ("is not valid YAML", "flow sequence at line 5, column 11", "line 6",
         "fix the YAML syntax at line 5")),
    Bad("yaml-colon-in-value", lambda p: setattr(p, "yaml_text", "format: 1\nname: tiny: x\n"),
        None, "name: tiny: x",
        ("is not valid YAML", "mapping values are not allowed here", "line 2")),
    Bad("duplicate-key", _duplicate_key, "components.target.path", "path",
        ("appears twice", "silently keep only the last")),
    Bad("top-level-not-a-mapping", lambda p: setattr(p, "yaml_text", "- 1\n- 2\n"), None,
        [1, 2], ("must be a mapping", "a list")),
    Bad("format-2", _set("format", 2), "format", 2,
        ("unsupported package format 2", "reads format 1")),
    Bad("missing-field", _set("max_context", "-"), "max_context", None,
        ("required field 'max_context' is missing", "add max_context:")),
    Bad("extra-unknown-field", _set("state.k0.seq_axes", 2), "state.k0.seq_axes", 2,
        ("unknown field 'seq_axes'", "did you mean 'seq_axis'", "fields allowed here")),
    Bad("quoted-integer", _set("vocab_size", "96"), "vocab_size", "96",
        ("must be an integer, not a string", "without quotes")),
    Bad("zero-vocab", _set("vocab_size", 0), "vocab_size", 0, ("must be > 0",)),
    Bad("bad-dtype-name", _set("dtype", "fp32"), "dtype", "fp32",
        ("not one of the allowed values", "'float32', 'float16' or 'bfloat16'")),
    Bad("unknown-role", _set("components.target.inputs.token_ids", "input_ids"),
        "components.target.inputs.token_ids", "token_ids",
        ("unknown input role 'token_ids'", "tokens, positions, embeddings, carry")),
    Bad("unknown-output-role", _set("components.target.outputs.logit", "logits"),
        "components.target.outputs.logit", "logit",
        ("unknown output role 'logit'", "did you mean 'logits'", "logits, hidden, carry")),
    Bad("bad-component-name", lambda p: p.doc["components"].update(
        {"my target": p.doc["components"].pop("target")}), "components.my target",
        "my target", ("contains characters", "letters, digits")),
    Bad("token-id-past-vocab", _set("prompts.0.2", VOCAB), "prompts[0][2]", VOCAB,
        ("token id 96", "outside the vocabulary [0, 96)", "vocab_size is 96")),
    Bad("negative-token-id", _set("prompts.1.1", -3), "prompts[1][1]", -3,
        ("token id -3", "[0, 96)")),
    Bad("empty-prompt", _set("prompts.1", []), "prompts[1]", [],
        ("needs at least 1 item", "at least one token")),
    Bad("prompt-longer-than-max-context", _set("prompts.0", [1] * (MAX_CONTEXT + 1)),
        "prompts[0]", f"{MAX_CONTEXT + 1} tokens",
        ("65 tokens, longer than max_context 64", "at most 64 tokens")),
    Bad("bos-past-vocab", _set("bos_id", 200), "bos_id", 200, ("outside the vocabulary",)),
    Bad("state-cell-unknown-component", _set("state.k0.component", "drafter"),
        "state.k0.component", "drafter",
        ("names component 'drafter'", "does not declare", "use one of the components: target")),
    Bad("bad-seq-axis", _set("state.k0.seq_axis", 4), "state.k0.seq_axis", 4,
        ("seq_axis 4 is outside the cell's rank 4", "an axis in 0..3")),
    Bad("kv-without-update", _set("state.k0.update", "-"), "state.k0.update", None,
        ("needs update", "append", "static")),
    Bad("seq-axis-on-recurrent", _set("state.r0.seq_axis", 0), "state.r0.seq_axis", 0,
        ("kv cells only", "remove seq_axis")),
    Bad("recurrent-zero-extent", _set("state.r0.shape", [1, 0]), "state.r0.shape", [1, 0],
        ("fixed shape", "axis 1 has extent 0")),
    Bad("append-kv-nonzero-seq", _set("state.k0.shape", [1, HEADS, 4, HEAD_DIM]),
        "state.k0.shape", [1, HEADS, 4, HEAD_DIM], ("starts empty", "set shape[2] to 0")),
    Bad("static-kv-seq-not-max-context", _both(
        _set("state.k0.update", "static"), _set("state.k0.shape", [1, HEADS, 32, HEAD_DIM])),
        "state.k0.shape", [1, HEADS, 32, HEAD_DIM],
        ("sequence extent (axis 2) is 32, not max_context 64", "set shape[2] to 64")),
    Bad("port-bound-twice", _set("state.r0.input", "input_ids"), "state.r0.input",
        "input_ids", ("already bound by components.target.inputs.tokens",)),
    Bad("speculative-not-reserved", _set("decoding.speculative", {"width": 4}),
        "decoding.speculative", {"width": 4}, ("reserved", "speculative: null")),
    Bad("greedy-takes-no-fields", _set("decoding.greedy", {"temperature": 0.7}),
        "decoding.greedy.temperature", 0.7, ("takes no fields", "greedy: {}")),
    Bad("missing-onnx-file", _set("components.target.path", "tagret.onnx"),
        "components.target.path", "tagret.onnx",
        ("'tagret.onnx' does not exist", "did you mean 'target.onnx'",
         ".onnx files present: target.onnx")),
    Bad("traversal-path", _traversal, "components.target.path", "../x.onnx",
        ("climbs out with '..'", "outside the package folder", "relative path (e.g. x.onnx)")),
    Bad("absolute-path", _absolute, "components.target.path", "<abs>",
        ("is absolute", "relative path (e.g. x.onnx)")),
    Bad("symlink-escape", _symlink_escape, "components.target.path", "linked.onnx",
        ("symbolic link", "outside the package folder")),
    Bad("missing-tokenizer", _set("tokenizer", {"kind": "huggingface", "path": "tok.json"}),
        "tokenizer.path", "tok.json", ("'tok.json' does not exist", "there are no .json files")),
    Bad("onnx-does-not-parse", _garbage_onnx, "components.target.path", "target.onnx",
        ("is not a readable ONNX model", "re-export target.onnx"), where="onnx"),
    Bad("unknown-port-name", _set("components.target.inputs.tokens", "input_idz"),
        "components.target.inputs.tokens", "input_idz",
        ("not a graph input of target.onnx", "did you mean 'input_ids'",
         "input_ids, position_ids, past_key_0, state_in")),
    Bad("unknown-output-port", _set("components.target.outputs.hidden", "hiddens"),
        "components.target.outputs.hidden", "hiddens",
        ("not a graph output of target.onnx", "logits, hidden, present_key_0, state_out")),
    Bad("port-is-a-weight", _set("components.target.inputs.positions", "w_logits"),
        "components.target.inputs.positions", "w_logits", ("is an initializer (a weight)",)),
    Bad("state-input-not-in-graph", _set("state.k0.input", "past_key"), "state.k0.input",
        "past_key", ("state cell 'k0' names 'past_key'", "not a graph input of target.onnx")),
    Bad("state-output-not-in-graph", _set("state.k0.output", "present"), "state.k0.output",
        "present", ("not a graph output of target.onnx", "present_key_0")),
    Bad("tokens-declared-float", _model(tokens_type=TensorProto.FLOAT),
        "components.target.inputs.tokens", "input_ids",
        ("declares 'input_ids' (role tokens) as float32", "requires int64",
         "export input_ids as int64")),
    Bad("logits-not-package-dtype", _set("dtype", "float16"),
        "components.target.outputs.logits", "logits",
        ("'logits' (role logits) as float32", "package dtype requires float16",
         "set dtype: float32")),
    Bad("logits-width-not-vocab", _model(logits_width=VOCAB + 4),
        "components.target.outputs.logits", "logits",
        ("100 columns", "vocab_size is 96", "set vocab_size: 100")),
    Bad("state-dtype-mismatch", _set("state.r0.dtype", "float16"), "state.r0.dtype",
        "float16", ("declared float16", "'state_in' as float32", "set dtype: float32")),
    Bad("state-rank-mismatch", _both(_set("state.k0.shape", [1, HEADS, 0]),
                                     _set("state.k0.seq_axis", 2)),
        "state.k0.shape", [1, HEADS, 0], ("rank 3", "rank 4 [1, 2, past, 8]")),
    Bad("state-extent-mismatch", _set("state.r0.shape", [1, 32]), "state.r0.shape", [1, 32],
        ("fixes axis 1 of 'state_in' to 16", "set shape[1] to 16")),
    Bad("append-kv-graph-fixes-seq", _model(kv_seq=MAX_CONTEXT), "state.k0.update", "append",
        ("fixes the sequence axis 2 of 'past_key_0' to 64", "grows along it",
         "declare update: static")),
    Bad("graph-input-left-unbound", _model(extra_input=True), "components.target.inputs",
        "attention_mask", ("'attention_mask' of target.onnx is bound to no role",
                           "declare a state cell with input: attention_mask")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_package_is_refused_with_its_error(case: Bad, pkg: Pkg):
    case.mutate(pkg)
    root = pkg.write()
    with pytest.raises(PackageError) as info:
        load_package(root)
    err = info.value
    text = str(err)
    assert err.field == case.field, text
    expected_value = {"<abs>": str(root.parent / "x.onnx"), "<root>": str(root)}.get(
        case.value, case.value) if isinstance(case.value, str) else case.value
    assert err.value == expected_value, text
    for needle in case.needles:
        assert needle in text, f"{needle!r} not in: {text}"
    assert err.remedy, text
    assert "Input should be" not in text  # pydantic's raw sentence is never what users see
    named = {"yaml": pkg.yaml_path, "onnx": root / "target.onnx"}[case.where]
    assert err.where is not None and err.where.startswith(str(named)), text
    assert text.startswith(err.where)
    if err.field is not None and case.where == "yaml":
        assert re.fullmatch(re.escape(str(pkg.yaml_path)) + r":\d+", err.where), text


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_errors_point_at_the_offending_line(pkg: Pkg):
    pkg.doc["components"]["target"]["inputs"]["tokens"] = "input_idz"
    root = pkg.write()
    with pytest.raises(PackageError) as info:
        load_package(root)
    line = _line_of(pkg.yaml_path.read_text(), "tokens: input_idz")
    assert info.value.where == f"{pkg.yaml_path}:{line}"


def test_every_problem_is_named_when_there_are_several(pkg: Pkg):
    pkg.doc["vocab_size"] = "96"
    pkg.doc["state"]["k0"]["dtype"] = "f32"
    with pytest.raises(PackageError) as info:
        load_package(pkg.write())
    assert info.value.field == "vocab_size"
    assert "1 of 2 problems" in str(info.value) and "state.k0.dtype" in str(info.value)


def test_missing_folder_is_named(tmp_path: Path):
    with pytest.raises(PackageError) as info:
        load_package(tmp_path / "nowhere")
    assert "does not exist" in str(info.value) and str(tmp_path / "nowhere") in str(info.value)


def test_read_spec_checks_the_yaml_without_the_graphs(pkg: Pkg):
    pkg.models.clear()
    root = pkg.write()
    assert read_spec(root).name == "tiny_llama"  # no ONNX file needed
    with pytest.raises(PackageError):
        load_package(root)


def test_external_data_outside_the_package_is_refused(pkg: Pkg):
    root = pkg.write()
    model = build_target()
    onnx.save_model(model, str(root / "target.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    (root.parent / "w.bin").write_bytes((root / "w.bin").read_bytes())
    saved = onnx.load(str(root / "target.onnx"), load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../w.bin"
    onnx.save(saved, str(root / "target.onnx"))
    with pytest.raises(PackageError) as info:
        load_package(root)
    assert info.value.value == "../w.bin" and "outside the package folder" in str(info.value)


# -- content hash ------------------------------------------------------------------------------
def _write_files(folder: Path, files: dict[str, bytes], order: list[str]) -> Path:
    for rel in order:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel])
    return folder


def test_hash_is_sha256_of_the_package(pkg: Pkg):
    package = load_package(pkg.write())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", package.content_hash)


def test_hash_changes_when_one_byte_changes_and_returns_when_restored(pkg: Pkg):
    root = pkg.write()
    before = package_content_hash(root)
    data = bytearray((root / "target.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (root / "target.onnx").write_bytes(bytes(data))
    assert package_content_hash(root) != before
    data[len(data) // 2] ^= 0x01
    (root / "target.onnx").write_bytes(bytes(data))
    assert package_content_hash(root) == before


def test_hash_is_remembered_until_a_file_is_written_again_even_with_its_old_mtime(
        pkg: Pkg, monkeypatch):
    from engines.package import hashing

    root = pkg.write()
    before = package_content_hash(root)
    reads = []
    real = hashing._folder_hash
    monkeypatch.setattr(hashing, "_folder_hash", lambda entries: reads.append(1) or real(entries))
    assert package_content_hash(root) == before and reads == []  # remembered: not read again
    target = root / "target.onnx"
    old = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))  # same size
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the old modification time
    assert package_content_hash(root) != before and reads == [1]


def test_hash_follows_paths_and_file_boundaries(tmp_path: Path):
    base = package_content_hash(_write_files(tmp_path / "a", {"x": b"ab", "y": b""}, ["x", "y"]))
    moved = package_content_hash(_write_files(tmp_path / "b", {"x": b"a", "y": b"b"}, ["x", "y"]))
    renamed = package_content_hash(_write_files(tmp_path / "c", {"z": b"ab", "y": b""},
                                                ["z", "y"]))
    assert len({base, moved, renamed}) == 3


_names = st.text(alphabet="abcxyz_.", min_size=1, max_size=6).filter(
    lambda s: s not in (".", ".."))


@given(files=st.dictionaries(st.lists(_names, min_size=1, max_size=3).map("/".join),
                             st.binary(max_size=64), min_size=1, max_size=6),
       seed=st.randoms(use_true_random=False))
def test_hash_is_independent_of_creation_order_and_location(files, seed):
    # a path cannot be both a file and a folder
    paths = sorted(files)
    assume(not any(q.startswith(p + "/") for p in paths for q in paths))
    shuffled = list(paths)
    seed.shuffle(shuffled)
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        first = package_content_hash(_write_files(Path(one) / "p", files, paths))
        second = package_content_hash(_write_files(Path(two) / "deeper" / "q", files,
                                                   list(reversed(shuffled))))
    assert first == second


# -- hostile YAML: refused in bounded time, one clear error ------------------------------------
def _alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, needle", [
    (_alias_bomb(9), "expands to more than"),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("x: &a [1, *a]\n", "recursive alias"),
])
def test_hostile_yaml_is_refused_quickly_naming_the_file(pkg: Pkg, text, needle):
    import time

    pkg.yaml_text = text
    root = pkg.write()
    start = time.perf_counter()
    with pytest.raises(PackageError, match=needle) as info:
        load_package(root)
    # a bound on hostile input, not a speed claim: the 9-level bomb took 62 s before
    assert time.perf_counter() - start < 15.0
    assert "package.yaml" in str(info.value) and info.value.remedy


def test_a_benign_alias_still_loads(pkg: Pkg):
    """Aliases are allowed when they expand to something reasonable."""
    root = pkg.write()
    first = list(pkg.doc["prompts"][0])
    doc = {k: v for k, v in pkg.doc.items() if k != "prompts"}
    (root / "package.yaml").write_text(yaml.safe_dump(doc) + f"prompts:\n- &p {first}\n- *p\n")
    assert load_package(root).spec.prompts == [first, first]
