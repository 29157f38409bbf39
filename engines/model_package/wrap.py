"""One variant of an onnx-genai model package, written as a lockstep package.

The variant's graph is kept; what lockstep's interpreter does not feed is computed inside
it from the ``positions`` role (an ``position_ids`` input is added when the graph has
none): a static cache's write index is the first position of the step and its sequence
length the position after the last (``write_indices = positions[:, 0]``, ``nonpad =
write_indices + M``, what onnx-genai's driver feeds); a growing cache's attention mask is
ones over past + M (as ``lockstep import-genai`` computes it). Each cache pair becomes a
kv state cell: ``static`` along the axis its TensorScatter writes, extent
``max_sequence_length``; ``append`` along the head-major sequence axis. The tokenizer
(``tokenizer.json``, ``chat_template.jinja``) is copied beside it and ``model_package.json``
records where the package came from.

A variant with ``genai_config.json`` and no inference metadata is an onnxruntime-genai
build and goes through that wrapper (``engines.backends.genai_package``).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import onnx
import yaml
from google.protobuf import text_format
from onnx import TensorProto, helper

from engines.backends.genai_package import mask_prologue, wrap_genai_build
from engines.errors import EngineUnavailable, PackageError
from engines.genai_model_facts import model_facts
from engines.model_package.manifest import Variant
from engines.model_package.metadata import Metadata, read_metadata
from engines.package import load_package
from engines.tokenizer import PackageTokenizer

ORIGIN_FILE = "model_package.json"
COMPONENT_FILE = "target.onnx"
DTYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
          TensorProto.BFLOAT16: "bfloat16"}
INTS = (TensorProto.INT64, TensorProto.INT32)
PROLOGUE = "/lockstep/ports/"


def load_graph(path: Path) -> onnx.ModelProto:
    """The variant's model: binary ONNX (external data left where it is) or a textproto."""
    try:
        if path.name.endswith((".textproto", ".pbtxt", ".txtpb")):
            model = onnx.ModelProto()
            text_format.Parse(path.read_text(), model)
        else:
            model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - any parse failure is the file's
        raise PackageError(f"{path.name} is not an ONNX model ({type(err).__name__}: "
                           f"{str(err)[:200]})", field="model_file", value=str(path),
                           remedy="give the variant's exported model", where=str(path)) from None
    if not model.graph.node:
        raise PackageError(f"{path.name} holds no graph", field="model_file", value=str(path),
                           remedy="give the variant's exported model, not a placeholder",
                           where=str(path))
    return model


def _dims(vi: onnx.ValueInfoProto) -> list:
    t = vi.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.shape.dim]


def _facts(variant: Variant) -> dict:
    """bos/eos/vocab/context from genai_config.json's model section, where there is one."""
    if variant.genai_config is None:
        return {}
    try:
        model = json.loads(variant.genai_config.read_text()).get("model") or {}
    except (OSError, ValueError, AttributeError) as err:
        raise PackageError(f"genai_config.json cannot be read ({err})", field="genai_config",
                           value=str(variant.genai_config), remedy="write it as JSON",
                           where=str(variant.genai_config)) from None
    if not isinstance(model, dict):
        raise PackageError("genai_config.json's model is not a mapping of fields",
                           field="model", value=type(model).__name__,
                           remedy="write genai_config.json as its builder does",
                           where=str(variant.genai_config))
    return model_facts(model, variant.genai_config, PackageError)


def _template_bos(tokenizer: Path | None) -> int | None:
    """The special token a tokenizer.json's template puts first (what encoding adds)."""
    if tokenizer is None or not (tokenizer / "tokenizer.json").is_file():
        return None
    try:
        post = json.loads((tokenizer / "tokenizer.json").read_text()).get("post_processor") or {}
        first = (post.get("single") or [{}])[0].get("SpecialToken", {}).get("id")
        ids = (post.get("special_tokens") or {}).get(first, {}).get("ids") or []
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    return ids[0] if len(ids) == 1 and isinstance(ids[0], int) else None


def default_prompts(vocab: int, special: set, bos: int | None, room: int) -> list[list[int]]:
    """Two prompts of spread token ids, none of them special (the package's own defaults;
    text prompts go through its tokenizer with ``--text``)."""
    lead = [] if bos is None else [bos]
    ordinary = [t for t in range(vocab) if t not in special] or list(range(vocab))
    out = []
    for length, step in ((4, 7), (7, 5)):
        count = min(length, max(room - len(lead), 1))
        out.append(lead + [ordinary[(5 + step * i) % len(ordinary)] for i in range(count)])
    return out


class _Graph:
    """The variant's graph with lockstep's bindings: ports checked, prologue added."""

    def __init__(self, model: onnx.ModelProto, where: str):
        self.model, self.where = model, where
        weights = {t.name for t in model.graph.initializer}
        self.inputs = {vi.name: vi for vi in model.graph.input if vi.name not in weights}
        self.outputs = {vi.name: vi for vi in model.graph.output}
        self.prologue: list[onnx.NodeProto] = []
        self.bound: set[str] = set()

    def fail(self, message: str, field: str, value, remedy: str) -> PackageError:
        return PackageError(message, field=field, value=value, remedy=remedy, where=self.where)

    def need(self, name: str, side: str, field: str) -> onnx.ValueInfoProto:
        ports = self.inputs if side == "input" else self.outputs
        if name not in ports:
            raise self.fail(f"the metadata names {name!r}, which is not a graph {side}",
                            field, name, f"use one of the graph {side}s: "
                                         f"{', '.join(sorted(ports)) or '(none)'}")
        if side == "input":
            self.bound.add(name)
        return ports[name]

    def computed(self, name: str, field: str, value: str) -> None:
        """Graph input ``name`` (int64 or int32 [batch]) becomes ``value`` cast to its type."""
        vi = self.need(name, "input", field)
        elem = vi.type.tensor_type.elem_type
        if elem not in INTS or len(_dims(vi)) != 1:
            raise self.fail(f"{name!r} is not an integer vector [batch]", field,
                            (TensorProto.DataType.Name(elem), _dims(vi)),
                            "declare the static cache's int64 (or int32) [batch] inputs")
        self.model.graph.input.remove(vi)
        self.prologue.append(helper.make_node("Cast", [value], [name], to=elem,
                                              name=PROLOGUE + name))

    def write(self, folder: Path, source: Path) -> None:
        for node in reversed(self.prologue):  # named, so a reader can tell them apart
            node.name = node.name or PROLOGUE + node.output[0].rsplit("/", 1)[-1]
            self.model.graph.node.insert(0, node)
        onnx.save(self.model, str(folder / COMPONENT_FILE))
        data = {e.value for t in self.model.graph.initializer for e in t.external_data
                if e.key == "location"}
        for name in sorted(data):  # copied: onnx refuses hard-linked weight files
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise self.fail("the model's weights live outside its variant folder",
                                "external_data.location", name,
                                "keep the weights beside the model")
            shutil.copyfile(source.parent / name, folder / name)


def _positions(g: _Graph, meta: Metadata) -> str:
    """The graph input bound to ``positions``: the declared one, or one added here."""
    if meta.io.position_ids_input:
        vi = g.need(meta.io.position_ids_input, "input", "model.io.position_ids_input")
        if vi.type.tensor_type.elem_type != TensorProto.INT64:
            raise g.fail("the position ids are not int64", "model.io.position_ids_input",
                         meta.io.position_ids_input, "export int64 position ids [batch, seq]")
        return meta.io.position_ids_input
    name = "position_ids" if "position_ids" not in g.inputs else "lockstep_position_ids"
    g.model.graph.input.append(helper.make_tensor_value_info(
        name, TensorProto.INT64, ["batch", "sequence"]))
    g.inputs[name] = g.model.graph.input[-1]
    g.bound.add(name)
    return name


def _static_cells(g: _Graph, meta: Metadata, positions: str, dtype: str) -> tuple[dict, int]:
    """kv cells (update static) of every declared pair, and the buffer length."""
    sc = meta.io.static_cache
    lists = {k: getattr(sc, k) for k in ("key_cache_inputs", "value_cache_inputs",
                                         "key_cache_outputs", "value_cache_outputs")}
    if len({len(v) for v in lists.values()}) != 1:
        raise g.fail("the static cache's four lists differ in length",
                     "model.io.static_cache", {k: len(v) for k, v in lists.items()},
                     "declare one key and value input and output per layer")
    scatters = {n.input[0]: n for n in g.model.graph.node
                if n.op_type == "TensorScatter" and n.input}
    cells, length = {}, None
    for side in ("key", "value"):
        for i, (port_in, port_out) in enumerate(zip(lists[f"{side}_cache_inputs"],
                                                    lists[f"{side}_cache_outputs"])):
            field = f"model.io.static_cache.{side}_cache_inputs[{i}]"
            vi = g.need(port_in, "input", field)
            g.need(port_out, "output", f"model.io.static_cache.{side}_cache_outputs[{i}]")
            node = scatters.get(port_in)
            if node is None or node.output[0] != port_out:
                raise g.fail(f"{port_in!r} is not written by a TensorScatter into {port_out!r}",
                             field, port_in, "declare the cache pairs the graph's TensorScatter "
                                             "nodes write (their input 0 and output)")
            dims = _dims(vi)
            axis = next((a.i for a in node.attribute if a.name == "axis"), -2) % len(dims)
            shape = [1] + dims[1:]
            if any(not isinstance(d, int) or d <= 0 for d in shape):
                raise g.fail(f"{port_in!r} has a symbolic extent besides the batch", field,
                             dims, "export the static cache with fixed extents")
            if length not in (None, shape[axis]):
                raise g.fail("the static caches differ in length", field, shape[axis],
                             f"give every layer's buffer {length} positions")
            length = shape[axis]
            cells[f"{side[0]}{i}"] = {"kind": "kv", "component": "target", "input": port_in,
                                      "output": port_out, "dtype": dtype, "shape": shape,
                                      "seq_axis": axis, "update": "static"}
    if meta.max_sequence_length not in (None, length):
        raise g.fail("max_sequence_length differs from the cache buffers' length",
                     "model.max_sequence_length", meta.max_sequence_length,
                     f"declare {length}, the positions the buffers hold")
    zero = PROLOGUE + "zero"
    g.prologue += [
        helper.make_node("Constant", [], [zero], value=helper.make_tensor(zero, TensorProto.INT64,
                                                                          [], [0])),
        helper.make_node("Gather", [positions, zero], [PROLOGUE + "start"], axis=1),
        helper.make_node("Shape", [positions], [PROLOGUE + "shape"], start=1, end=2),
        helper.make_node("Add", [PROLOGUE + "start", PROLOGUE + "shape"], [PROLOGUE + "end"])]
    g.computed(sc.write_indices_input, "model.io.static_cache.write_indices_input",
               PROLOGUE + "start")
    g.computed(sc.kv_sequence_length_input, "model.io.static_cache.kv_sequence_length_input",
               PROLOGUE + "end")
    return cells, length


def _append_cells(g: _Graph, meta: Metadata, tokens: str, dtype: str) -> dict:
    """kv cells (update append) of the past/present pairs; a declared attention mask
    computed as ones over past + M."""
    io = meta.io
    if len(io.kv_inputs or []) != len(io.kv_outputs or []):
        raise g.fail("kv_inputs and kv_outputs differ in length", "model.io.kv_outputs",
                     (len(io.kv_inputs or []), len(io.kv_outputs or [])),
                     "pair every past input with its present output")
    cells = {}
    for i, (port_in, port_out) in enumerate(zip(io.kv_inputs, io.kv_outputs)):
        field = f"model.io.kv_inputs[{i}]"
        dims = _dims(g.need(port_in, "input", field))
        g.need(port_out, "output", f"model.io.kv_outputs[{i}]")
        if len(dims) < 3:
            raise g.fail(f"{port_in!r} is not a cache of rank 3 or more", field, dims,
                         "declare the past key/value inputs")
        axis = 1 if io.kv_layout == "seq_major_bsnh" else len(dims) - 2
        shape = [1] + [0 if a == axis else d for a, d in enumerate(dims) if a > 0]
        if any(not isinstance(d, int) or (d <= 0 and a != axis) for a, d in enumerate(shape)):
            raise g.fail(f"{port_in!r} has a symbolic extent besides batch and sequence",
                         field, dims, "export the cache with fixed head counts and widths")
        cells[f"kv{i}"] = {"kind": "kv", "component": "target", "input": port_in,
                           "output": port_out, "dtype": dtype, "shape": shape,
                           "seq_axis": axis, "update": "append"}
    if io.attention_mask_input:
        if not io.kv_inputs or next(iter(cells.values()))["seq_axis"] != 2:
            raise g.fail("an attention mask is computed only beside a head-major growing cache",
                         "model.io.attention_mask_input", io.attention_mask_input,
                         "declare kv_inputs/kv_outputs [batch, heads, seq, head], or export "
                         "without the mask")
        vi = g.need(io.attention_mask_input, "input", "model.io.attention_mask_input")
        g.model.graph.input.remove(vi)
        nodes = mask_prologue(io.kv_inputs[0], tokens)
        nodes[-1].output[0] = io.attention_mask_input
        g.prologue += nodes
    return cells


def wrap_variant(variant: Variant, out: Path, name: str, origin: dict) -> Path:
    """Write ``variant`` as a lockstep package into ``out`` (a new folder); returns it."""
    if variant.metadata is None:
        if variant.genai_config is not None:
            return wrap_genai_build(variant.folder, out, name)
        raise PackageError("the variant declares no ports: it has neither inference metadata "
                           "nor genai_config.json", field="inference_metadata",
                           value=str(variant.folder),
                           remedy="add inference_metadata.yaml with model.io (token_input, "
                                  "logits_output, the cache)", where=str(variant.folder))
    meta = read_metadata(variant.metadata)
    where = str(variant.metadata)
    g = _Graph(load_graph(variant.model), where)
    io = meta.io
    tokens = io.token_input or "input_ids"
    vi = g.need(tokens, "input", "model.io.token_input")
    if vi.type.tensor_type.elem_type != TensorProto.INT64 or len(_dims(vi)) != 2:
        raise g.fail("the token input is not int64 [batch, seq]", "model.io.token_input",
                     tokens, "export int64 token ids")
    logits_name = io.logits_output or "logits"
    logits = g.need(logits_name, "output", "model.io.logits_output")
    dtype = DTYPES.get(logits.type.tensor_type.elem_type)
    if dtype is None or len(_dims(logits)) != 3:
        raise g.fail("the logits output is not float32/float16/bfloat16 [batch, seq, vocab]",
                     "model.io.logits_output", logits_name, "export the logits of every position")
    facts = _facts(variant)
    vocab = _dims(logits)[2] if isinstance(_dims(logits)[2], int) else None
    vocab = vocab or meta.vocab_size or facts.get("vocab_size")
    if vocab is None:
        raise g.fail("the vocabulary size is not known", "model.vocab_size", None,
                     "declare model.vocab_size, or export logits with a fixed last axis")
    if io.static_cache is not None and io.kv_inputs:
        raise g.fail("a graph declares either a static cache or past/present pairs",
                     "model.io.kv_inputs", io.kv_inputs, "declare the one the graph has")
    inputs = {"tokens": tokens}
    if io.static_cache is not None:
        inputs["positions"] = _positions(g, meta)
        state, max_context = _static_cells(g, meta, inputs["positions"], dtype)
    else:
        if io.position_ids_input:
            inputs["positions"] = _positions(g, meta)
        state = _append_cells(g, meta, tokens, dtype) if io.kv_inputs else {}
        max_context = meta.max_sequence_length or facts.get("max_context")
        if max_context is None:
            raise g.fail("the context length is not known", "model.max_sequence_length", None,
                         "declare model.max_sequence_length")
    leftover = sorted(set(g.inputs) - g.bound)
    if leftover:
        raise g.fail("the graph has inputs the metadata binds to nothing", "graph.input",
                     leftover, "declare them in model.io (or export without them)")
    outputs = {"logits": logits_name}
    if io.hidden_output:
        g.need(io.hidden_output, "output", "model.io.hidden_output")
        outputs["hidden"] = io.hidden_output
    bos = meta.bos_id if meta.bos_id is not None else facts.get("bos_id",
                                                                _template_bos(variant.tokenizer))
    eos = meta.eos_id if meta.eos_id is not None else facts.get("eos_id")
    spec = {"format": 1, "name": name,
            "description": f"{origin['package']} {variant.label} ({variant.ep or 'any EP'}), "
                           f"imported from an onnx-genai model package",
            "vocab_size": int(vocab), "bos_id": bos, "eos_id": eos,
            "max_context": int(max_context), "dtype": dtype,
            "prompts": default_prompts(int(vocab), {0, bos, eos}, bos, int(max_context) // 2),
            "components": {"target": {"path": COMPONENT_FILE, "inputs": inputs,
                                      "outputs": outputs}},
            "state": state, "decoding": {"greedy": {}, "speculative": None}}
    tokenizer = variant.tokenizer / "tokenizer.json" if variant.tokenizer is not None else None
    has_tokenizer = tokenizer is not None and tokenizer.is_file()
    if has_tokenizer:
        _check_tokenizer(tokenizer, g)
    out.mkdir(parents=True)
    if has_tokenizer:
        for extra in ("tokenizer.json", "chat_template.jinja"):
            if (variant.tokenizer / extra).is_file():
                shutil.copyfile(variant.tokenizer / extra, out / extra)
        spec["tokenizer"] = {"kind": "huggingface", "path": "tokenizer.json"}
    g.write(out, variant.model)
    (out / "package.yaml").write_text(yaml.safe_dump(spec, sort_keys=False,
                                                     default_flow_style=None, width=100))
    added = [n.output[0] for n in g.prologue if not n.output[0].startswith(PROLOGUE)]
    (out / ORIGIN_FILE).write_text(json.dumps(
        {**origin, "variant": variant.name, "component": variant.component,
         "ep": variant.ep, "model_file": variant.model.name,
         "computed_in_graph": added}, indent=2, sort_keys=True) + "\n")
    load_package(out)  # every port checked against the graph
    return out


def _check_tokenizer(path: Path, g) -> None:
    """The variant's tokenizer.json loads as a tokenizer (a shared asset's content is not
    otherwise checked): else the import is refused, naming the file, not a later --text."""
    try:
        PackageTokenizer(path)
    except EngineUnavailable:
        return  # no tokenizers installed here: checked when a text prompt needs it
    except PackageError as err:
        raise g.fail(f"its tokenizer {path} is not one ({err.message})", "tokenizer",
                     str(path.parent), "give the variant the tokenizer.json its model was "
                                       "exported with") from None


def folder_name(text: str) -> str:
    """A package folder name from manifest names (the format's name pattern)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".-") or "variant"
    return cleaned
