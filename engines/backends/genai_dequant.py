"""onnxruntime-genai's int4 build with its own weights dequantized: the float32 reference an
int4 build is judged against, and the numeric scheme it declares.

The builder's int4 model (``-p int4``) holds every linear layer as com.microsoft
``MatMulNBits`` (4-bit weights in blocks along K, one float scale per block, an optional zero
point) and the tied embedding as ``GatherBlockQuantized`` over the same blocks. Judged against
lockstep's float32 conversion of the checkpoint, the int4 rounding of every weight would look
like a bug; judged against float32 over *its own* weights, only what the engine computes
differently remains (onnxruntime's CPU kernel at ``accuracy_level`` 4 quantizes the
activations to int8 blocks too). So each ``MatMulNBits`` becomes a plain ``MatMul`` (plus
``Add`` for a bias) over its weight dequantized exactly, and ``GatherBlockQuantized`` a
``Gather`` over its table dequantized exactly, both by the formulas lockstep's own kernels
use (``engines.native.ops.quantized``, float32: (q - zero_point) * scale, one rounding);
every other node and weight is kept. The graph is then wrapped as a package like any
onnxruntime-genai build (``genai_package.wrap_genai_build``) and cached beside the build,
rebuilt when the build or this module changes (``dequantized_package_for``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from engines.backends.genai_package import ORIGIN_FILE as WRAP_FILE, wrap_genai_build
from engines.errors import PackageError
from engines.native.array_backend import NumpyArrayBackend
from engines.native.ops.quantized import GatherBlockQuantized, MatMulNBits

MATMUL, GATHER = "MatMulNBits", "GatherBlockQuantized"
ORIGIN_FILE = "dequantized.json"
COPIED = ("genai_config.json", "tokenizer.json", "tokenizer_config.json",
          "chat_template.jinja", "build.json")


def _load(folder: Path, external: bool):
    config = json.loads((folder / "genai_config.json").read_text())
    return onnx.load(str(folder / config["model"]["decoder"]["filename"]),
                     load_external_data=external)


def build_scheme(folder: Path) -> dict:
    """The numeric scheme of an int4 build, read from its graph: the ``MatMulNBits`` nodes'
    bits, block size and accuracy level (``onnxruntime-cpu:matmulnbits-int4-b32-acc4``), with
    how many nodes carry each and the embedding's ``GatherBlockQuantized`` settings. A build
    with no ``MatMulNBits`` has no quantized scheme (None)."""
    model = _load(Path(folder), external=False)

    def attrs(node) -> dict:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    linear: Counter[tuple[int, int, int]] = Counter()
    gather: Counter[tuple[int, int]] = Counter()
    for node in model.graph.node:
        a = attrs(node)
        if node.op_type == MATMUL:
            linear[(a.get("bits", 4), a.get("block_size"), a.get("accuracy_level", 0))] += 1
        elif node.op_type == GATHER:
            gather[(a.get("bits", 4), a.get("block_size", 128))] += 1
    if not linear:
        return {"numeric_scheme": None, "matmulnbits": {}, "gather_block_quantized": {}}
    bits, block, level = max(sorted(linear), key=linear.__getitem__)
    return {"numeric_scheme": f"onnxruntime-cpu:matmulnbits-int{bits}-b{block}-acc{level}",
            "matmulnbits": {f"int{b}-b{s}-acc{lv}": n for (b, s, lv), n in sorted(linear.items())},
            "gather_block_quantized": {f"int{b}-b{s}": n for (b, s), n in sorted(gather.items())}}


class _Values:
    """The graph's constant values by name: initializers, Constant nodes, and Reshapes of
    those (the builder reshapes the tied embedding's blocks before gathering from them)."""

    def __init__(self, graph):
        self.graph = graph
        self.known = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.producer = {out: node for node in graph.node for out in node.output}

    def __call__(self, name: str, where: str) -> np.ndarray:
        if name in self.known:
            return self.known[name]

        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = numpy_helper.to_array(helper.get_attribute_value(node.attribute[0]))
        elif node is not None and node.op_type == "Reshape":
            value = self(node.input[0], where).reshape(
                [int(n) for n in self(node.input[1], where)])
        else:
            raise PackageError(f"{where} reads {name!r}, which is not a constant lockstep can "
                               f"dequantize", field="input", value=name,
                               remedy="dequantize a build whose quantized weights are "
                                      "initializers (onnxruntime-genai's builder writes them so)",
                               where=where)
        self.known[name] = value
        return value


def dequantize_graph(model) -> dict[str, int]:
    """Replace, in place, every ``MatMulNBits`` and ``GatherBlockQuantized`` node of ``model``
    (loaded with its weights) by float32 ``MatMul``/``Gather`` over its dequantized weights;
    unused initializers and nodes are dropped. Returns how many nodes of each were replaced."""
    graph, be = model.graph, NumpyArrayBackend()
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=17)
    value = _Values(graph)
    nodes, added, replaced = [], [], Counter()
    for node in graph.node:
        where = f"node {node.name or '<unnamed>'!r} ({node.op_type})"
        if node.op_type == MATMUL and node.domain == "com.microsoft":
            kernel = MatMulNBits(node, opset)
            ins = list(node.input) + [""] * (6 - len(node.input))
            zp = value(ins[3], where) if ins[3] else None
            w = kernel.weight(be, value(ins[1], where), value(ins[2], where), zp)
            name = f"{node.name}/dequantized_weight"
            added.append(numpy_helper.from_array(np.ascontiguousarray(w.T), name))
            out = node.output[0]
            if ins[5]:  # a bias: MatMul then Add
                nodes.append(helper.make_node("MatMul", [ins[0], name], [f"{out}/no_bias"],
                                              name=f"{node.name}/MatMul"))
                nodes.append(helper.make_node("Add", [f"{out}/no_bias", ins[5]], [out],
                                              name=f"{node.name}/Add"))
            else:
                nodes.append(helper.make_node("MatMul", [ins[0], name], [out],
                                              name=f"{node.name}/MatMul"))
            replaced[MATMUL] += 1
        elif node.op_type == GATHER and node.domain == "com.microsoft":
            kernel = GatherBlockQuantized(node, opset)
            data = value(node.input[0], where)
            zp = value(node.input[3], where) if len(node.input) > 3 and node.input[3] else None
            (table,) = kernel(be, data, np.arange(data.shape[0]), value(node.input[2], where),
                              zp)
            name = f"{node.name}/dequantized_table"
            added.append(numpy_helper.from_array(np.ascontiguousarray(table, np.float32), name))
            nodes.append(helper.make_node("Gather", [name, node.input[1]], list(node.output),
                                          name=f"{node.name}/Gather", axis=0))
            replaced[GATHER] += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(_live(nodes, {o.name for o in graph.output}))
    used = {i for n in graph.node for i in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep + [t for t in added if t.name in used])
    return dict(replaced)


def _live(nodes: list, outputs: set[str]) -> list:
    """The nodes some graph output depends on, in their order."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
    return live[::-1]


def dequantize_build(build: Path, out: Path) -> Path:
    """A build folder like ``build`` whose graph holds float32 weights (``dequantize_graph``),
    for ``wrap_genai_build``; ``dequantized.json`` says what was replaced."""
    build, out = Path(build), Path(out)
    model = _load(build, external=True)
    replaced = dequantize_graph(model)
    out.mkdir(parents=True)
    config = json.loads((build / "genai_config.json").read_text())
    filename = config["model"]["decoder"]["filename"]
    onnx.save(model, str(out / filename), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{filename}.data", size_threshold=1024)
    for name in COPIED:
        if (build / name).is_file():
            shutil.copyfile(build / name, out / name)
    (out / ORIGIN_FILE).write_text(json.dumps(
        {"dequantized_from": str(build), "replaced": replaced, **build_scheme(build)},
        indent=2, sort_keys=True) + "\n")
    return out


def dequantized_package_folder(build) -> Path:
    """Where ``dequantized_package_for`` keeps a ``GenaiBuild``'s float32 reference."""
    return build.folder.parent / f"{build.folder.name}-dequantized-package"


def dequantized_package_for(build) -> Path:
    """The float32 package over a ``GenaiBuild``'s own dequantized weights, made once and
    kept beside the build in the cache (remade when the build or this module changes)."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + build.record["key"].encode()
                            ).hexdigest()
    folder = dequantized_package_folder(build)
    origin = folder / WRAP_FILE
    if (folder / "package.yaml").is_file() and origin.is_file() \
            and json.loads(origin.read_text()).get("wrapper_key") == digest:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    staged = folder.parent / f".{folder.name}.build"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        dequantize_build(build.folder, staged)
        wrap_genai_build(staged, folder, f"genai-{build.folder.name}-dequantized",
                         wrapper_key=digest)
        shutil.copyfile(staged / ORIGIN_FILE, folder / ORIGIN_FILE)
        return folder
    finally:
        shutil.rmtree(staged, ignore_errors=True)


__all__ = ["build_scheme", "dequantize_build", "dequantize_graph", "dequantized_package_for",
           "dequantized_package_folder"]
