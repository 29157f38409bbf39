"""The speculative section checked against the graphs: borrowed ports, carry, embedding table.

``schema.py`` already knows that every name refers to something declared; here the ONNX
graphs say whether a borrowed port really is a proposer input shaped like the target cell it
reads, whether the carry ports exist, and whether the embedding initializer is a float
``[vocab_size, width]`` table whose width plus the carry width fits the fused input.
"""
from __future__ import annotations

import onnx
from onnx import numpy_helper

from engines.errors import PackageError
from engines.package.messages import did_you_mean
from engines.package.ports import FLOATS, Where, graph_inputs, graph_outputs
from engines.package.schema import PackageSpec, field_path

BASE = ("decoding", "speculative")


class SpeculativeCheck:
    """Checks ``decoding.speculative`` against the proposer's and the target's graphs."""

    def __init__(self, spec: PackageSpec, models: dict[str, onnx.ModelProto],
                 files: dict[str, str], where: Where):
        self.spec, self.models, self.files, self.where = spec, models, files, where
        self.sp = spec.decoding.speculative

    def _error(self, loc: tuple, message: str, value, remedy: str) -> PackageError:
        return PackageError(message, field=field_path(loc), value=value, remedy=remedy,
                            where=self.where(loc))

    def run(self) -> None:
        if self.sp is None or self.sp.proposer is None:  # prompt-lookup: no proposer graph
            return
        self._borrows()
        self._carry()
        self._embedding()

    def _borrows(self) -> None:
        sp = self.sp
        inputs = graph_inputs(self.models[sp.proposer])
        file = self.files[sp.proposer]
        for port_name, cell_name in sp.borrows.items():
            loc = (*BASE, "borrows", port_name)
            port = inputs.get(port_name)
            if port is None:
                raise self._error(loc, f"borrowed port {port_name!r} is not a graph input of "
                                       f"{file}{did_you_mean(port_name, inputs)}", port_name,
                                  f"use one of the graph inputs of {file}: "
                                  f"{', '.join(inputs) or '(none)'}")
            cell = self.spec.state[cell_name]
            if port.elem is not None and port.elem != cell.dtype:
                raise self._error(loc, f"{file} declares borrowed input {port_name!r} as "
                                       f"{port.elem}, but it reads cell {cell_name!r} of dtype "
                                       f"{cell.dtype}", cell_name,
                                  f"export {port_name} as {cell.dtype}")
            if port.dims is not None and len(port.dims) != len(cell.shape):
                raise self._error(loc, f"{file} declares borrowed input {port_name!r} with rank "
                                       f"{len(port.dims)} {port.shape_text()}, but cell "
                                       f"{cell_name!r} has rank {len(cell.shape)} "
                                       f"({cell.shape})", cell_name,
                                  f"export {port_name} with the cell's rank {len(cell.shape)}")

    def _carry(self) -> None:
        sp = self.sp
        if sp.carry is None:
            return
        file = self.files[sp.proposer]
        model = self.models[sp.proposer]
        for side, port, ports in (("input", sp.carry.input, graph_inputs(model)),
                                  ("output", sp.carry.output, graph_outputs(model))):
            if port is not None and port not in ports:
                raise self._error((*BASE, "carry", side), f"carry {side} {port!r} is not a "
                                  f"graph {side} of {file}{did_you_mean(port, ports)}", port,
                                  f"use one of the graph {side}s of {file}: {', '.join(ports)}")

    def _embedding(self) -> None:
        sp = self.sp
        emb = sp.embedding
        if emb is None:
            return
        loc = (*BASE, "embedding", "initializer")
        model = self.models[emb.component]
        file = self.files[emb.component]
        weights = {t.name: t for t in model.graph.initializer}
        table = weights.get(emb.initializer)
        if table is None:
            raise self._error(loc, f"{file} has no initializer {emb.initializer!r}"
                                   f"{did_you_mean(emb.initializer, weights)}", emb.initializer,
                              f"name the initializer that holds the [vocab, width] token table")
        dims = tuple(int(d) for d in table.dims)
        elem = onnx.helper.tensor_dtype_to_np_dtype(table.data_type).name
        if elem not in FLOATS or len(dims) != 2 or dims[0] != self.spec.vocab_size:
            raise self._error(loc, f"initializer {emb.initializer!r} of {file} is {elem} "
                                   f"{list(dims)}, but a token table is a float [vocab_size="
                                   f"{self.spec.vocab_size}, width] matrix", emb.initializer,
                              "name a float table with one row per token id")
        fused = graph_inputs(self.models[sp.proposer]).get(
            self.spec.components[sp.proposer].inputs[sp.fused_input])
        seed = graph_outputs(self.models[sp.target]).get(
            self.spec.components[sp.target].outputs[sp.carry.seed])
        if fused is None or seed is None or not fused.dims or not seed.dims:
            return
        width, carry = fused.dims[-1], seed.dims[-1]
        if isinstance(width, int) and isinstance(carry, int) and width != dims[1] + carry:
            raise self._error((*BASE, "fused_input"),
                              f"the fused input {fused.name!r} is {width} wide, but the "
                              f"embedding ({dims[1]}) plus the carry seed "
                              f"{seed.name!r} ({carry}) make {dims[1] + carry}", sp.fused_input,
                              "export the fused input as wide as embedding + carry")


def embedding_table(model: onnx.ModelProto, initializer: str):
    """The token table as a host numpy array (read once, at session setup)."""
    for t in model.graph.initializer:
        if t.name == initializer:
            return numpy_helper.to_array(t)
    raise KeyError(initializer)
