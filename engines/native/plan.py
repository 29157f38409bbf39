"""A component's execution plan, built once: node order, adopted weights, bound kernels.

Values split in two at build time. *Host-resolved* values are shape arithmetic: integer
initializers, ``Constant`` outputs, ``Shape``/``Size`` outputs (read from ``.shape``, never
from the data), declared host inputs, and the outputs of ops whose inputs are all
host-resolved; they are computed with numpy on the host, those that depend on no input
once at build time. Everything else runs on the backend; ops over weights alone (no input
reaches them) run there once at build too. Inputs a kernel reads on the host
(Reshape's shape, Slice bounds, axes, ...) must be host-resolved, or the build fails with
an ``ExecutionError`` naming the node and the input; so a plan that builds never reads a
device value back. Host values feeding device kernels are adopted (static ones once); on a
device backend each run-time one is adopted once per distinct value and cached on the
device (keyed by dtype, shape and bytes), so for a fixed set of feed shapes a forward moves
nothing from the host: no per-step copy, and nothing a CUDA graph capture would record
from a temporary host buffer.

An op whose output shape is read from its input's values (``NonZero``) runs wherever its
inputs are on the host backend; on a device backend only over host-resolved inputs, and a
plan that would run it over device values is refused when built.

Before binding, the fusion pass (``engines.native.fusion``) replaces the converter's
standard subgraphs by one ``lockstep.fused`` node each; ``fuse=False`` keeps the graph node
for node.
"""
from __future__ import annotations

import functools
import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from engines.errors import ExecutionError, InputError, LockstepError, ResidencyError
from engines.native.step_memo import MEMO_OPS, StepMemo, memo_enabled
from engines.residency import residency_of

from .array_backend import ArrayBackend, NumpyArrayBackend
from .fusion import fuse_nodes
from .ops import Kernel, kernel_for
from .ops.fused import prepare as prepare_fused

_SUBGRAPH_OPS = {"If", "Loop", "Scan", "SequenceMap"}

# How a step obtains one input: a value fixed at build, the run's environment, or the
# environment's host value adopted to the backend (cached under a derived key).
_CONST, _ENV, _ENV_ADOPT = 0, 1, 2


def _dev_key(name: str) -> str:
    return "\0dev\0" + name


# Device copies of run-time host values kept per value name (least recently used dropped):
# a prefill and a decode signature need two each; the rest absorbs shapes that vary.
HOST_VALUE_CACHE_PER_VALUE = 8


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return onnx.defs.onnx_opset_version()


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name or f'#{index}'!r} ({node.op_type})"


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """Op types in the main graph that have no kernel here (domain-qualified if not ONNX;
    com.microsoft contrib ops with a kernel are supported)."""
    missing = set()
    for node in model.graph.node:
        if kernel_for(node) is None:
            onnx_domain = node.domain in ("", "ai.onnx")
            missing.add(node.op_type if onnx_domain else f"{node.domain}:{node.op_type}")
    return sorted(missing)


def required_host_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs whose values flow into an input a kernel reads on the host.

    A caller that owns such inputs as host arrays (a test harness feeding Reshape's shape
    as a graph input) passes them as ``Plan(..., host_inputs=...)``.
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    work: list[str] = []
    for node in graph.node:
        kernel = kernel_for(node)
        if kernel is None:
            continue
        work.extend(node.input[i] for i in kernel.host_inputs
                    if i < len(node.input) and node.input[i])
    needed: set[str] = set()
    while work:
        name = work.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is None:
            continue
        kernel = kernel_for(node)
        if kernel is not None and kernel.metadata_only:
            continue
        work.extend(x for x in node.input if x)
    init = {t.name for t in graph.initializer}
    return {i.name for i in graph.input if i.name in needed and i.name not in init}


class _Step:
    __slots__ = ("kernel", "label", "backend", "inputs", "outputs", "named", "free", "node",
                 "memo")

    def __init__(self, kernel, label, backend, inputs, outputs, node=None):
        self.kernel = kernel
        self.label = label
        self.backend = backend
        self.inputs = inputs
        self.outputs = outputs
        self.named = sum(1 for y in outputs if y)  # outputs the graph names (others unused)
        self.free: tuple[str, ...] = ()
        self.node = node  # the NodeProto, for ``run(..., observe=)``
        self.memo = None  # a StepMemo where the step's device path can be replayed


def _attach_memos(steps: list[_Step], backend) -> None:
    """A ``StepMemo`` on each device step whose op type replays (``step_memo.MEMO_OPS``),
    keyed by identity where the operand is a constant or a cached copy of a host value."""
    if getattr(backend, "residency", "host") == "host" \
            or not hasattr(backend, "fused_kernels"):
        return
    if not memo_enabled():
        return
    for step in steps:
        if step.backend is backend and type(step.kernel).__name__ in MEMO_OPS:
            step.memo = StepMemo(backend.xp, frozenset(
                i for i, (kind, _) in enumerate(step.inputs) if kind in (_CONST, _ENV_ADOPT)))


class Plan:
    """Build once per component, then ``run(feeds)`` per forward."""

    def __init__(self, model: onnx.ModelProto, backend: ArrayBackend, *,
                 host_inputs: Iterable[str] = (), fuse: bool = True):
        self.backend = backend
        self.host = NumpyArrayBackend()
        graph = model.graph
        self.opset = _default_opset(model)

        missing = unsupported_ops(model)
        if missing:
            counts = Counter(n.op_type for n in graph.node)
            listed = ", ".join(f"{op} ({counts[op.split(':')[-1]]} nodes)" for op in missing)
            sub = sorted(set(missing) & _SUBGRAPH_OPS)
            remedy = ("run this model on ort-cpu or onnx-reference, or re-export it without "
                      "these ops; engines.native.ops.KERNELS lists the supported ones")
            if sub:
                remedy = f"subgraph ops ({', '.join(sub)}) are out of scope; " + remedy
            raise ExecutionError(f"unsupported ops: {listed}", field="graph.node.op_type",
                                 value=missing, remedy=remedy, where=f"graph {graph.name!r}")
        if len(graph.sparse_initializer):
            raise ExecutionError("sparse initializers are not supported",
                                 field="graph.sparse_initializer",
                                 value=[s.values.name for s in graph.sparse_initializer],
                                 remedy="store them as dense initializers")

        initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initializers]
        self.output_names = [o.name for o in graph.output]
        self._input_types = {i.name: i.type for i in graph.input if i.name not in initializers}
        self.host_inputs = frozenset(host_inputs)
        unknown = sorted(self.host_inputs - set(self.input_names))
        if unknown:
            raise ExecutionError("host_inputs names that are not graph inputs",
                                 field="host_inputs", value=unknown,
                                 remedy=f"graph inputs are {self.input_names}")

        # ---- fusion (engines.native.fusion): recognised subgraphs become one node each;
        # ``fuse=False`` keeps the graph node for node (tests compare the two) ----
        self.fusions: Counter = Counter()
        self._model, self._unfused = model, None
        schedule = graph
        if fuse:
            nodes, self.fusions = fuse_nodes(graph.node, graph.initializer, self.output_names)
            if self.fusions:
                schedule = onnx.GraphProto(name=graph.name, node=nodes)
                prepare_fused(backend)
        order = self._topological(schedule, set(self.input_names) | set(initializers))
        kernels = [self._bind(node, i) for i, node in order]

        # ---- which values are host-resolved, and which of those are fixed at build ----
        host = set(self.host_inputs) | {n for n, a in initializers.items() if a.dtype.kind in "iu"}
        known = set(initializers)  # values (hence shapes) known at build time
        static = {n for n in host if n in initializers}
        on_host: list[bool] = []
        weight_only: list[bool] = []  # device ops over build-time values only (weights)
        for (_, node), kernel in zip(order, kernels):
            ins = [x for x in node.input if x]
            if kernel.metadata_only:
                is_host, is_static = True, all(x in known for x in ins)
            else:
                is_host = all(x in host for x in ins)
                is_static = is_host and all(x in static for x in ins)
            folds = not is_host and bool(ins) and all(x in known for x in ins)
            on_host.append(is_host)
            weight_only.append(folds)
            outs = [y for y in node.output if y]
            if is_host:
                host.update(outs)
            if is_static:
                static.update(outs)
            if is_static or folds:
                known.update(outs)
        self.host_resolved = frozenset(host)
        self.static = frozenset(static)

        # ---- every host slot must be host-resolved ----
        for ((index, node), kernel) in zip(order, kernels):
            for slot in sorted(kernel.host_inputs):
                if slot < len(node.input) and node.input[slot] and node.input[slot] not in host:
                    name = node.input[slot]
                    raise ExecutionError(
                        f"input {slot} ({name!r}) is read on the host but is computed from "
                        "device values", where=_node_label(node, index),
                        field=f"{node.op_type}.input[{slot}]", value=name,
                        remedy="derive it from Shape, Constant or integer initializers only "
                               "(shape arithmetic), or feed it as a declared host input")

        # ---- an output shape read from values: on a device only over host values ----
        if backend.residency != "host":
            for ((index, node), kernel, is_host) in zip(order, kernels, on_host):
                if kernel.value_dependent_shape and not is_host:
                    raise ExecutionError(
                        f"{node.op_type}'s output shape is read from its input's values, "
                        "which live on the device here", where=_node_label(node, index),
                        field=f"{node.op_type}.input[0]", value=node.input[0],
                        remedy="compute its input from shape arithmetic (Shape, Constant, "
                               "integer initializers) so it runs on the host, or run this "
                               "model on native-host or ort-cpu")

        # ---- fold what depends on no input once: shape arithmetic on the host, weight-only
        # device ops (a transposed tied embedding, say) on the backend ----
        const_host: dict[str, Any] = dict(initializers)
        self._const_dev: dict[str, Any] = {}  # backend values fixed at build
        keep = backend.keep_constant  # a backend may keep something per constant

        def const_dev(name: str) -> Any:
            if name not in self._const_dev:
                self._const_dev[name] = keep(backend.adopt(const_host[name]))
            return self._const_dev[name]

        dynamic: list[tuple[int, onnx.NodeProto, Kernel, bool]] = []
        for ((index, node), kernel, is_host, folds) in zip(order, kernels, on_host,
                                                           weight_only):
            outs = [y for y in node.output if y]
            label = _node_label(node, index)
            if outs and all(y in static for y in outs):
                args = [None if not x else const_host[x] if x in const_host
                        else self._const_dev[x] for x in node.input]
                values = self._call(kernel, self.host, args, label)
                for y, v in zip(node.output, values):
                    if y:
                        const_host[y] = v
            elif folds:
                args = [None if not x else const_host[x] if slot in kernel.host_inputs
                        else const_dev(x) if x in const_host else self._const_dev[x]
                        for slot, x in enumerate(node.input)]
                values = self._call(kernel, backend, args, label)
                for y, v in zip(node.output, values):
                    if y:
                        self._const_dev[y] = keep(v)
            else:
                dynamic.append((index, node, kernel, is_host))

        # ---- the run-time schedule ----
        steps: list[_Step] = []
        for index, node, kernel, is_host in dynamic:
            label = _node_label(node, index)
            inputs = []
            for slot, x in enumerate(node.input):
                if not x:
                    inputs.append((_CONST, None))
                elif is_host or slot in kernel.host_inputs:
                    # Host step, or host slot: the host value (or raw value for metadata ops;
                    # only those can take a folded backend value).
                    inputs.append((_CONST, const_host[x]) if x in const_host else
                                  (_CONST, self._const_dev[x]) if x in self._const_dev else
                                  (_ENV, x))
                elif x in self._const_dev and x not in const_host:
                    inputs.append((_CONST, self._const_dev[x]))
                elif x in const_host:
                    inputs.append((_CONST, const_dev(x)))
                elif x in host:
                    inputs.append((_ENV_ADOPT, x))
                else:
                    inputs.append((_ENV, x))
            steps.append(_Step(kernel, label, self.host if is_host else backend,
                               tuple(inputs), tuple(node.output), node))

        produced = set(self.input_names) | {y for s in steps for y in s.outputs if y}
        self._outputs: list[tuple[int, Any]] = []
        for y in self.output_names:
            if y in const_host:
                self._outputs.append((_CONST, const_dev(y)))
            elif y in self._const_dev:
                self._outputs.append((_CONST, self._const_dev[y]))
            elif y not in produced:
                raise ExecutionError("graph output is produced by no node", field="graph.output",
                                     value=y, remedy="connect it or remove it from the outputs")
            elif y in host:
                self._outputs.append((_ENV_ADOPT, y))
            else:
                self._outputs.append((_ENV, y))

        # Free every run-time value after its last reader (outputs are kept).
        last_use: dict[str, int] = {}
        for i, step in enumerate(steps):
            for kind, key in step.inputs:
                if kind == _ENV:
                    last_use[key] = i
                elif kind == _ENV_ADOPT:
                    last_use[key] = last_use[_dev_key(key)] = i
        keep = set(self.output_names) | {_dev_key(y) for y in self.output_names}
        frees: dict[int, list[str]] = {}
        for key, i in last_use.items():
            if key not in keep:
                frees.setdefault(i, []).append(key)
        for i, step in enumerate(steps):
            step.free = tuple(frees.get(i, ()))
        _attach_memos(steps, backend)
        self.steps = steps
        self.node_count = len(order)
        # name -> {(dtype, shape, bytes): device copy}; unused on a host backend
        self._device_values: dict[str, OrderedDict] = {}

    # ---- build helpers ----------------------------------------------------------------

    @staticmethod
    def _topological(graph: onnx.GraphProto, available: set[str]):
        nodes = list(enumerate(graph.node))
        producers: dict[str, int] = {}
        for i, node in nodes:
            for y in node.output:
                if not y:
                    continue
                if y in producers or y in available:
                    raise ExecutionError("a value is defined twice", field="node.output",
                                         value=y, where=_node_label(node, i),
                                         remedy="give every value one producer")
                producers[y] = i
        for i, node in nodes:
            for x in node.input:
                if x and x not in available and x not in producers:
                    raise ExecutionError(f"input {x!r} is not a graph input, an initializer or "
                                         "any node's output", field="node.input", value=x,
                                         where=_node_label(node, i),
                                         remedy="fix the graph's wiring")
        waiting = {i: {producers[x] for x in node.input if x in producers} for i, node in nodes}
        readers: dict[int, list[int]] = {}
        for i, deps in waiting.items():
            for d in deps:
                readers.setdefault(d, []).append(i)
        ready = sorted(i for i, deps in waiting.items() if not deps)
        order = []
        heapq.heapify(ready)
        while ready:
            i = heapq.heappop(ready)
            order.append((i, graph.node[i]))
            for r in readers.get(i, ()):
                waiting[r].discard(i)
                if not waiting[r]:
                    heapq.heappush(ready, r)
        if len(order) != len(nodes):
            stuck = sorted(set(range(len(nodes))) - {i for i, _ in order})
            raise ExecutionError("the graph has a cycle", field="graph.node",
                                 value=[graph.node[i].name or f"#{i}" for i in stuck],
                                 remedy="an ONNX graph must be acyclic")
        return order

    def _bind(self, node: onnx.NodeProto, index: int) -> Kernel:
        try:
            return kernel_for(node)(node, self.opset)
        except LockstepError as err:
            if err.where is None:
                err.where = _node_label(node, index)
                err.args = (err.render(),)
            raise
        except Exception as exc:  # an attribute of the wrong kind, say
            raise ExecutionError(f"cannot bind the kernel: {type(exc).__name__}: {exc}",
                                 field=f"{node.op_type}.attribute",
                                 value=[a.name for a in node.attribute],
                                 where=_node_label(node, index),
                                 remedy="check the node's attributes against the ONNX "
                                        "spec") from exc

    @staticmethod
    def _call(kernel: Kernel, be, args, label: str):
        try:
            values = kernel(be, *args)
        except LockstepError as err:
            if err.where is None:
                err.where = label
                err.args = (err.render(),)
            raise
        except Exception as exc:
            raise ExecutionError(f"{type(exc).__name__}: {exc}", where=label, field="inputs",
                                 value=[getattr(a, "shape", a) if a is not None else None
                                        for a in args],
                                 remedy="check the feeds' shapes and dtypes against the "
                                        "model") from exc
        return [np.asarray(v) if isinstance(v, np.generic) else v for v in values]

    # ---- running ------------------------------------------------------------------------

    def check_feeds(self, feeds: Mapping[str, Any]) -> None:
        """Names, dtypes, ranks and residency of the feeds; every failure names the input."""
        missing = [n for n in self.input_names if n not in feeds]
        unknown = sorted(set(feeds) - set(self.input_names))
        if missing:
            raise InputError("missing feeds", field="feeds", value=missing,
                             remedy=f"feed every graph input: {self.input_names}")
        if unknown:
            raise InputError("feeds name no graph input", field="feeds", value=unknown,
                             remedy=f"graph inputs are {self.input_names}")
        for name in self.input_names:
            value = feeds[name]
            ttype = self._input_types[name]
            if not ttype.HasField("tensor_type"):
                continue  # sequences and optionals pass through Identity untouched
            where = residency_of(value)
            want = "host" if name in self.host_inputs else self.backend.residency
            if where != want:
                raise ResidencyError(f"feed lives on {where}, the plan wants it on {want}",
                                     field=f"feeds[{name!r}]", value=where,
                                     remedy="adopt it to the backend first" if want != "host"
                                     else "host inputs are shape arithmetic: pass numpy arrays")
            elem = ttype.tensor_type.elem_type
            if elem:
                expected = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
                if value.dtype != expected:
                    raise InputError("feed has the wrong dtype", field=f"feeds[{name!r}].dtype",
                                     value=str(value.dtype), remedy=f"the model wants {expected}")
            if ttype.tensor_type.HasField("shape"):
                dims = ttype.tensor_type.shape.dim
                if value.ndim != len(dims):
                    raise InputError("feed has the wrong rank", field=f"feeds[{name!r}].shape",
                                     value=tuple(value.shape),
                                     remedy=f"the model wants rank {len(dims)}")
                for axis, (d, actual) in enumerate(zip(dims, value.shape)):
                    if d.HasField("dim_value") and d.dim_value != actual:
                        raise InputError(f"feed dimension {axis} is fixed at {d.dim_value}",
                                         field=f"feeds[{name!r}].shape",
                                         value=tuple(value.shape),
                                         remedy=f"give axis {axis} extent {d.dim_value}")

    def run(self, feeds: Mapping[str, Any],
            observe: Callable[[onnx.NodeProto, str, Any], None] | None = None,
            profile: Callable[[onnx.NodeProto | None, Callable[[], Any]], Any] | None = None
            ) -> dict[str, Any]:
        """Graph outputs by name; arrays live on the backend.

        ``observe`` (forensics, ``harness.forensics``): called as ``observe(node, name,
        value)`` for every output of every run-time step, in execution (topological) order,
        right after the step ran; values live where the step ran (host-resolved shape
        arithmetic on the host, the rest on the backend) and must not be written. Values
        fixed at build (constants, weight-only folds) are not run-time steps and are not
        observed. Without it nothing changes. A fused plan runs an observed forward on its
        unfused twin (built on the first such call), so every node of the graph as written
        is observed.

        ``profile`` (a device profile, ``suites/test_fused_kernels_cuda.py``): each run-time
        step runs as ``profile(node, call)``, which must return ``call()``; a timer wraps it
        (``node`` may be None for a step built without one). It sees this plan's own steps,
        fused nodes included."""
        if observe is not None and self.fusions:
            if self._unfused is None:
                self._unfused = Plan(self._model, self.backend, host_inputs=self.host_inputs,
                                     fuse=False)
            return self._unfused.run(feeds, observe)
        self.check_feeds(feeds)
        backend = self.backend
        env: dict[str, Any] = {name: feeds[name] for name in self.input_names}
        for step in self.steps:
            args = []
            for kind, key in step.inputs:
                if kind == _CONST:
                    args.append(key)
                elif kind == _ENV:
                    args.append(env[key])
                else:
                    dkey = _dev_key(key)
                    if dkey not in env:
                        env[dkey] = self._device_value(key, env[key])
                    args.append(env[dkey])
            if profile is None:
                if step.memo is None:
                    values = self._call(step.kernel, step.backend, args, step.label)
                else:
                    values = step.memo.run(functools.partial(
                        self._call, step.kernel, step.backend, args, step.label), args)
            else:
                values = profile(step.node, functools.partial(
                    self._call, step.kernel, step.backend, args, step.label))
            if len(values) < step.named:
                raise ExecutionError("kernel returned too few outputs", where=step.label,
                                     field="outputs", value=len(values),
                                     remedy="this is a kernel bug; please report it")
            for y, v in zip(step.outputs, values):
                if y:
                    env[y] = v
            if observe is not None:
                for y, v in zip(step.outputs, values):
                    if y:
                        observe(step.node, y, v)
            for key in step.free:
                env.pop(key, None)
        out = {}
        for name, (kind, key) in zip(self.output_names, self._outputs):
            if kind == _CONST:
                out[name] = key
            elif kind == _ENV:
                out[name] = env[key]
            elif backend.residency == "host":
                out[name] = backend.adopt(env[key])
            else:  # a private copy: the caller may write into an output (a state cell)
                out[name] = backend.xp.array(self._device_value(key, env[key]), copy=True)
        return out

    def _device_value(self, name: str, value: Any) -> Any:
        """The backend's copy of a run-time host value: adopted the first time this value
        (dtype, shape, bytes) is seen under ``name``, then served from the cache. Kernels
        never write their inputs, so a cached copy can be shared by every forward."""
        backend = self.backend
        if backend.residency == "host":
            return backend.adopt(value)
        host = np.asarray(value)
        key = (host.dtype.str, host.shape, host.tobytes())
        entries = self._device_values.setdefault(name, OrderedDict())
        cached = entries.get(key)
        if cached is None:
            cached = entries[key] = backend.adopt(host)
            if len(entries) > HOST_VALUE_CACHE_PER_VALUE:
                entries.popitem(last=False)
        else:
            entries.move_to_end(key)
        return cached

    def cached_device_values(self) -> list[Any]:
        """Every cached device copy of a host value: what a captured graph may read, so a
        graph slot keeps them alive for as long as its graph lives."""
        return [v for entries in self._device_values.values() for v in entries.values()]
