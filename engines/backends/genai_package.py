"""onnxruntime-genai's built model, wrapped as a lockstep package.

The ONNX graph onnxruntime-genai's builder writes (``genai_build``) is another engine's
component: fused com.microsoft ops (GroupQueryAttention, SkipSimplifiedLayerNormalization,
...), its own weight layout. Wrapped as a package it runs under lockstep's interpreter on any
engine that has those ops (ort-cpu now; native-host once it implements them), judged by the
oracle like any package. The builder's graph and weights are kept; one thing is added: its
``attention_mask`` input, which lockstep's interpreter does not feed, is computed inside the
graph as ones over ``past + M`` positions (batch 1, no padding: what a single-sequence
decode passes). The package binds ``input_ids`` to ``tokens``, each
``past_key_values.N.key/value`` -> ``present.N.key/value`` pair to an append kv cell, and
``logits``; ``genai_build.json`` beside it records the build it came from.

The graph is rewritten, the builder's external weight file copied beside it byte for byte
(onnx refuses hard-linked weight files). ``genai_package_for(build)`` keeps one wrapped
package per build in the cache.
Use: ``lockstep import-genai BUILD_FOLDER -o OUT [--prompts-from PACKAGE]`` (or
``python -m engines.backends.genai_package BUILD_FOLDER OUT``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

import onnx
import yaml
from onnx import TensorProto, helper

from engines.errors import InputError
from engines.genai_model_facts import model_facts
from engines.output_paths import check_output_folder
from engines.package import load_package

MASK = "attention_mask"
ORIGIN_FILE = "genai_build.json"
COMPONENT_FILE = "target.onnx"
ELEM_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}
# what the wrapper reads from genai_config.json's model.decoder (a decoder-only text model)
DECODER_KEYS = {"filename", "inputs", "outputs", "num_hidden_layers", "num_key_value_heads",
                "head_size"}
INPUT_KEYS = {"input_ids", "past_key_names", "past_value_names"}
OUTPUT_KEYS = {"logits", "present_key_names", "present_value_names"}
# the per-layer name patterns, each with one %d (inputs' two, then outputs' two)
LAYER_NAMES = ("past_key_names", "past_value_names", "present_key_names", "present_value_names")
DECODER_ONLY = "wrap a decoder-only text model built by onnxruntime-genai's builder"
# a child of the converter's logger: ``lockstep convert``'s progress shows these steps too
log = logging.getLogger("harness.convert.genai")


def _few(names, shown: int = 6) -> str:
    """A name list short enough for a one-line error."""
    names = sorted(names)
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more if names else "nothing"


def is_genai_build(folder: Path) -> bool:
    """A folder onnxruntime-genai's builder wrote (genai_config.json, no package.yaml): what
    ``lockstep import-genai`` reads, named where a package or a checkpoint was expected."""
    folder = Path(folder)
    return (folder / "genai_config.json").is_file() and not (folder / "package.yaml").exists()


def read_genai_config(build: Path) -> dict:
    """``genai_config.json`` of a build, checked for what the wrapper reads (the CLI checks a
    folder with it before removing anything)."""
    path = build / "genai_config.json"
    if not path.is_file():
        remedy = "give the folder onnxruntime-genai's model builder wrote (-o)"
        if (build / "config.json").is_file():  # the checkpoint the builder reads
            remedy = (f"a Hugging Face folder is built first: lockstep convert {build} "
                      f"--builder onnxruntime-genai")
        raise InputError(f"{build} has no genai_config.json: not an onnxruntime-genai build",
                         field="BUILD_FOLDER", value=str(build), remedy=remedy)
    try:
        config = json.loads(path.read_text())
    except ValueError as err:
        raise InputError(f"{path} is not JSON ({err})", field="genai_config.json",
                         value=str(path), remedy="rebuild with onnxruntime-genai's builder")
    model = config.get("model") if isinstance(config, dict) else None
    dec = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(dec, dict) or not DECODER_KEYS <= set(dec):
        found = dec if isinstance(dec, dict) else model if isinstance(model, dict) else {}
        raise InputError(f"genai_config.json's model.decoder lacks "
                         f"{sorted(DECODER_KEYS - set(dec or {}))} (found: {_few(found)})",
                         field="model.decoder", value=str(path), remedy=DECODER_ONLY)
    for part, keys in (("inputs", INPUT_KEYS), ("outputs", OUTPUT_KEYS)):
        if not isinstance(dec[part], dict) or not keys <= set(dec[part]):
            raise InputError(f"genai_config.json's model.decoder.{part} lacks "
                             f"{sorted(keys - set(dec[part] or {}))} "
                             f"(found: {_few(dec[part] or {})})",
                             field=f"model.decoder.{part}", value=str(path), remedy=DECODER_ONLY)
    model_facts(model, path, InputError, needs_vocab=True)
    for key in ("num_hidden_layers", "num_key_value_heads", "head_size"):
        value = dec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"genai_config.json's model.decoder.{key} is not a positive "
                             f"integer", field=f"model.decoder.{key}", value=value,
                             where=str(path), remedy="rebuild with onnxruntime-genai's "
                                                     "builder, or correct genai_config.json")
    for part, key in (*(("inputs", k) for k in LAYER_NAMES[:2]),
                      *(("outputs", k) for k in LAYER_NAMES[2:])):
        _check_layer_names(dec[part][key], f"model.decoder.{part}.{key}", path)
    if not (build / dec["filename"]).is_file():
        raise InputError(f"{build} has no {dec['filename']}, the graph genai_config.json "
                         f"names", field="model.decoder.filename", value=dec["filename"],
                         remedy="give the whole folder the builder wrote (-o), unmoved")
    return config


def _check_layer_names(names, field: str, path: Path) -> None:
    """A per-layer name pattern (``past_key_values.%d.key``) holds the layer index once."""
    try:
        ok = isinstance(names, str) and names % 0 != names % 1
    except (TypeError, ValueError):  # no %d, two of them, or a stray %
        ok = False
    if not ok:
        raise InputError(f"genai_config.json's {field} is not a per-layer name pattern with "
                         f"one %d for the layer index", field=field, value=names,
                         where=str(path), remedy="write it as the builder does, e.g. "
                                                 "past_key_values.%d.key")


def load_graph(path: Path) -> onnx.ModelProto:
    """The build's graph, its weights left in their external file; a file that does not
    parse (a download or build cut short) is refused naming it."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and onnx's own alike
        raise InputError(f"{path.name} is not a whole ONNX model ({type(err).__name__}: "
                         f"{str(err)[:120]})", field="model.decoder.filename", value=path.name,
                         where=str(path), remedy="the file may be cut short: download or "
                                                 "build it again") from None


def mask_prologue(first_past: str, ids: str) -> list:
    """Nodes computing ``attention_mask`` = ones[1, past + M] (int64) from the shapes of the
    first past key and of the token ids."""
    def const(name, values):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, TensorProto.INT64, [len(values)], values))

    p = "/lockstep/mask/"
    return [
        const(p + "two", [2]), const(p + "three", [3]), const(p + "one", [1]),
        const(p + "zero", [0]),
        helper.make_node("Shape", [first_past], [p + "past_shape"]),
        helper.make_node("Slice", [p + "past_shape", p + "two", p + "three"], [p + "past"]),
        helper.make_node("Shape", [ids], [p + "ids_shape"]),
        helper.make_node("Slice", [p + "ids_shape", p + "one", p + "two"], [p + "m"]),
        helper.make_node("Slice", [p + "ids_shape", p + "zero", p + "one"], [p + "batch"]),
        helper.make_node("Add", [p + "past", p + "m"], [p + "total"]),
        helper.make_node("Concat", [p + "batch", p + "total"], [p + "shape"], axis=0),
        helper.make_node("ConstantOfShape", [p + "shape"], [MASK],
                         value=helper.make_tensor(p + "ones", TensorProto.INT64, [1], [1])),
    ]


def wrap_genai_build(build: str | Path, out: str | Path, name: str | None = None,
                     prompts: list[list[int]] | None = None,
                     wrapper_key: str | None = None) -> Path:
    """Write the package for the onnxruntime-genai build in ``build`` into ``out`` (a new or
    empty folder) and return it, loaded and checked (``engines.package.load_package``).
    ``wrapper_key`` is recorded in ``genai_build.json`` (the cache's staleness check)."""
    build, out = Path(build).expanduser().resolve(), Path(out).expanduser().resolve()
    config = read_genai_config(build)
    model_cfg, dec = config["model"], config["model"]["decoder"]
    names_in, names_out = dec["inputs"], dec["outputs"]
    layers = int(dec["num_hidden_layers"])
    check_output_folder(out, "OUT")
    # the graph only: its weights stay in the builder's external data file, linked beside it
    log.info("reading %s", dec["filename"])
    model = load_graph(build / dec["filename"])
    graph = model.graph
    data_files = {e.value for t in graph.initializer for e in t.external_data
                  if e.key == "location"}
    inputs = {vi.name: vi for vi in graph.input}
    ids = names_in["input_ids"]
    mask = names_in.get("attention_mask")
    pasts = [(names_in["past_key_names"] % i, names_in["past_value_names"] % i)
             for i in range(layers)]
    for needed in [ids, *[n for pair in pasts for n in pair]]:
        if needed not in inputs:
            raise InputError(f"{dec['filename']} has no input {needed!r} that "
                             f"genai_config.json names (found: {_few(inputs)})",
                             field="decoder.inputs", value=needed, remedy=DECODER_ONLY)
    outputs = {vi.name for vi in graph.output}
    for needed in [names_out["logits"], *[names_out[k] % i for i in range(layers)
                                          for k in ("present_key_names", "present_value_names")]]:
        if needed not in outputs:
            raise InputError(f"{dec['filename']} has no output {needed!r} that "
                             f"genai_config.json names (found: {_few(outputs)})",
                             field="decoder.outputs", value=needed, remedy=DECODER_ONLY)
    if mask is not None and mask in inputs:
        if mask != MASK:
            raise InputError(f"the attention mask input is {mask!r}, not {MASK!r}",
                             field="decoder.inputs.attention_mask", value=mask,
                             remedy="wrap a build whose mask input is attention_mask")
        graph.input.remove(inputs[mask])
        for node in reversed(mask_prologue(pasts[0][0], ids)):
            graph.node.insert(0, node)
    leftover = [n for n in (vi.name for vi in graph.input)
                if n not in {ids, *[x for pair in pasts for x in pair]}
                and n not in {t.name for t in graph.initializer}]
    if leftover:
        raise InputError(f"{dec['filename']} has inputs lockstep would not feed: {leftover}",
                         field="graph.input", value=leftover,
                         remedy="wrap a text-only decoder build (input_ids, attention_mask, "
                                "past_key_values)")
    past_vi = inputs[pasts[0][0]].type.tensor_type
    dtype = ELEM_DTYPES.get(past_vi.elem_type)
    if dtype is None:
        raise InputError("the build's cache element type is not float32/float16/bfloat16",
                         field=pasts[0][0], value=past_vi.elem_type,
                         remedy="build with -p fp32, fp16 or bf16")
    kv_heads, head = int(dec["num_key_value_heads"]), int(dec["head_size"])
    state = {}
    for i, (pk, pv) in enumerate(pasts):
        for kind, port_in, port_out in (("k", pk, names_out["present_key_names"] % i),
                                        ("v", pv, names_out["present_value_names"] % i)):
            state[f"{kind}{i}"] = {"kind": "kv", "component": "target", "input": port_in,
                                   "output": port_out, "dtype": dtype,
                                   "shape": [1, kv_heads, 0, head], "seq_axis": 2,
                                   "update": "append"}
    origin = {}
    if (build / "build.json").is_file():
        origin = json.loads((build / "build.json").read_text())
    facts = model_facts(model_cfg, build / "genai_config.json", InputError, needs_vocab=True)
    bos, eos = facts.get("bos_id"), facts.get("eos_id")
    spec = {
        "format": 1,
        "name": name or f"genai-{build.name}",
        "description": (f"onnxruntime-genai {origin.get('builder_version', '?')} builder's "
                        f"{model_cfg.get('type', 'decoder')} model "
                        f"({origin.get('precision', dtype)}, -e "
                        f"{origin.get('execution_provider', '?')}), wrapped: attention_mask "
                        f"computed in the graph"),
        "vocab_size": facts["vocab_size"],
        "bos_id": bos, "eos_id": eos,
        "max_context": facts.get("max_context", 2048),
        "dtype": dtype,
        "prompts": prompts or [[bos if bos is not None else 0]],
        "components": {"target": {"path": COMPONENT_FILE, "inputs": {"tokens": ids},
                                  "outputs": {"logits": names_out["logits"]}}},
        "state": state,
        "decoding": {"greedy": {}, "speculative": None},
    }
    staged = out.parent / f".{out.name}.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        if (build / "tokenizer.json").is_file():
            shutil.copyfile(build / "tokenizer.json", staged / "tokenizer.json")
            spec["tokenizer"] = {"kind": "huggingface", "path": "tokenizer.json"}
        log.info("writing %s", COMPONENT_FILE)
        onnx.save(model, str(staged / COMPONENT_FILE))
        for data in sorted(data_files):  # copied: onnx refuses hard-linked weight files
            if Path(data).is_absolute() or ".." in Path(data).parts:
                raise InputError("the build's weights live outside its folder",
                                 field="external_data.location", value=data,
                                 remedy="wrap the folder the builder wrote, unmoved")
            log.info("copying %s (%.0f MB)", data, (build / data).stat().st_size / 1e6)
            shutil.copyfile(build / data, staged / data)
        (staged / "package.yaml").write_text(yaml.safe_dump(spec, sort_keys=False,
                                                            default_flow_style=None, width=100))
        (staged / ORIGIN_FILE).write_text(json.dumps(
            {**origin, "build_folder": str(build), "wrapper_key": wrapper_key,
             "wrapped": "attention_mask computed as ones[1, past + M] in the graph"},
            indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()
        staged.rename(out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    log.info("checking the package's ports against its graph")
    load_package(out)  # every port checked against the graph
    return out


def genai_package_folder(build) -> Path:
    """Where ``genai_package_for`` keeps a ``GenaiBuild``'s wrapped package."""
    return build.folder.parent / f"{build.folder.name}-package"


def genai_package_for(build, prompts: list[list[int]] | None = None) -> Path:
    """The wrapped package of a ``GenaiBuild``, kept beside it in the cache (rewrapped when
    the build, this module or the prompts change)."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + build.record["key"].encode()
                            + json.dumps(prompts).encode()).hexdigest()
    folder = genai_package_folder(build)
    origin = folder / ORIGIN_FILE
    if (folder / "package.yaml").is_file() and origin.is_file() \
            and json.loads(origin.read_text()).get("wrapper_key") == digest:
        return folder
    shutil.rmtree(folder, ignore_errors=True)  # a stale wrap (one per build: ~0.5 GB each)
    return wrap_genai_build(build.folder, folder, f"genai-{build.folder.name}", prompts,
                            wrapper_key=digest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engines.backends.genai_package",
        description="wrap an onnxruntime-genai build as a lockstep package")
    parser.add_argument("build", help="the folder onnxruntime-genai's builder wrote")
    parser.add_argument("out", help="the package folder to write (new or empty)")
    parser.add_argument("--prompts-from", help="a package whose prompts to copy (same "
                                               "tokenizer)")
    parser.add_argument("--name", help="the package name (default genai-<build folder>)")
    args = parser.parse_args(argv)
    prompts = None
    if args.prompts_from:
        prompts = [list(p) for p in load_package(args.prompts_from).spec.prompts]
    try:
        folder = wrap_genai_build(args.build, args.out, args.name, prompts)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["genai_package_folder", "genai_package_for", "is_genai_build", "main",
           "read_genai_config", "wrap_genai_build"]
