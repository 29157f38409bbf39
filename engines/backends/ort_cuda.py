"""``ort-cuda``: onnxruntime's CUDA provider, every input and output bound by pointer.

The independent GPU reference for ``native-cuda``: a different executor (onnxruntime's
kernels) under the same workflow interpreter, on one CuPy stream the engine owns and hands
to onnxruntime as ``user_compute_stream``, so CuPy's copies and onnxruntime's kernels are
ordered on one queue without host synchronisation between them.

Values never leave the device here:

- feeds are CuPy arrays (adopted by the interpreter through ``tensor_ops.adopt``), bound
  with ``IOBinding.bind_input(name, "cuda", device, dtype, shape, ptr)``; a host-empty array
  (an append cache before its first forward) is bound to a small engine-owned device buffer
  with a zero extent, so nothing crosses;
- outputs whose shape follows from the inputs' shapes (the graph's declared output dims,
  symbols resolved from the feeds) are preallocated CuPy buffers bound by pointer; the rest
  (an append cache's grown length) are allocated by onnxruntime on the device and wrapped as
  CuPy arrays over the same memory (``UnownedMemory`` keeping the ``OrtValue`` alive);
  ``copy_outputs_to_cpu`` is never called;
- the only read back is the interpreter's argmax through ``CudaTensorOps`` (4 bytes a row).

onnxruntime may itself insert ``MemcpyToHost`` nodes where a node it places on the CPU reads
a device value. Those copies bypass CuPy, so the transfer guard cannot see them: the engine
saves the optimized graph once per component, counts them (``memcpy_nodes``) and records
each as host staging in the ledger on every forward of that component.

CUDA graphs (``cuda_graph``, default on for ``static`` packages: no ``append`` kv cell).
Each component gets a second session with ``enable_cuda_graph``; its decode steps (M = 1)
run there with every input and output bound once to fixed device buffers: the feeds are
copied into the fixed inputs on the stream (device to device), the session runs, and the
fixed outputs are returned. They stay valid until that component's next graph run, which
is how the interpreter uses them (a step's outputs feed the next step, copied in first).
onnxruntime performs one or two regular warm-up runs (version dependent) before it
captures, so the first graph run of a component runs the session ``CAPTURE_RUNS`` times on
the same fixed inputs (the graph is a function of its inputs, so the result is the same):
after it onnxruntime has captured and every later run is a replay. The counters
(``ledger.slot(slot_name(component))``): ``captures`` 1 for that first run, ``replays`` one
per later graph run, ``fallbacks`` one per decode step that had to run eagerly (onnxruntime
refused the graph session, or the step's shapes differ from the captured ones).
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort

from engines.backends.ort_kernel_gaps import kernel_gap_unavailable
from engines.cuda_support import REMEDY as CUPY_REMEDY, cuda_availability, import_cupy
from engines.dtypes import dtype_of
from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, ExecutionError, InputError, ResidencyError
from engines.tensor_ops.cuda import CudaTensorOps

PROVIDER = "CUDAExecutionProvider"
REMEDY = ("install onnxruntime-gpu for your CUDA major in place of the CPU-only onnxruntime: "
          "pip install 'lockstep[cuda12]' (CUDA 12), or the onnxruntime-gpu wheel built for "
          "CUDA 13 (scripts/fetch_gpu_wheels.sh --with-ort-gpu stages it for the GPU machine)")
GRAPH_SLOT = "ORT_CUDA_GRAPH"
# onnxruntime's CUDA provider runs 1 (older releases) or 2 regular runs before it captures;
# a third run on the same inputs therefore always ends captured.
CAPTURE_RUNS = 3
EMPTY_SENTINEL_BYTES = 256
WIDTH_ROLES = ("tokens", "embeddings", "positions")  # inputs shaped [1, M, ...]

Dim = int | str | None


def slot_name(component: str) -> str:
    """The ledger slot of a component's CUDA graph: ``ORT_CUDA_GRAPH`` for the target."""
    return GRAPH_SLOT if component == "target" else f"{GRAPH_SLOT}:{component}"


def is_static_package(spec) -> bool:
    """Shape-stable: no kv cell grows (every kv cell is ``static``; recurrent cells are fixed)."""
    return not any(c.kind == "kv" and c.update == "append" for c in spec.state.values())


def value_dims(value_info: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    """Declared dims of a graph input/output: ints, symbol names, None for an unnamed dim;
    None when the rank itself is unknown."""
    ttype = value_info.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def resolve_output_shapes(input_dims: dict[str, tuple[Dim, ...] | None],
                          output_dims: dict[str, tuple[Dim, ...] | None],
                          feed_shapes: dict[str, tuple[int, ...]]
                          ) -> dict[str, tuple[int, ...] | None]:
    """Each output's shape where its declared dims are numbers or symbols that an input's
    shape fixes (``M`` from ``input_ids [1, M]``); None where onnxruntime must allocate."""
    symbols: dict[str, int] = {}
    for name, dims in input_dims.items():
        if dims is None or name not in feed_shapes:
            continue
        for dim, size in zip(dims, feed_shapes[name]):
            if isinstance(dim, str):
                symbols.setdefault(dim, int(size))
    out: dict[str, tuple[int, ...] | None] = {}
    for name, dims in output_dims.items():
        if dims is None:
            out[name] = None
            continue
        shape = []
        for dim in dims:
            if isinstance(dim, int):
                shape.append(dim)
            elif isinstance(dim, str) and dim in symbols:
                shape.append(symbols[dim])
            else:
                shape = None
                break
        out[name] = tuple(shape) if shape is not None else None
    return out


def numpy_dtype(elem_type: int) -> np.dtype:
    if elem_type == onnx.TensorProto.BFLOAT16:
        return dtype_of("bfloat16")
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def binding_type(dtype: np.dtype):
    """What ``IOBinding.bind_*`` takes as element type: the numpy scalar type, or the ONNX
    enum for bfloat16 (numpy has no bfloat16 of its own)."""
    if dtype.name == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    return dtype.type


# -- memory: where bound buffers live --------------------------------------------------------
class CudaMemory:
    """CuPy buffers on one device, every copy and allocation ordered on the engine's stream."""

    device_type = "cuda"

    def __init__(self, cupy, device_id: int, stream):
        self.cp = cupy
        self.device_id = device_id
        self.stream = stream
        self.residency = f"cuda:{device_id}"
        with self.scope():
            # bound for zero-extent values: onnxruntime gets a valid device address, and
            # no bytes are read or written through it
            self._sentinel = cupy.empty((EMPTY_SENTINEL_BYTES,), dtype=cupy.uint8)

    @contextlib.contextmanager
    def scope(self):
        with self.cp.cuda.Device(self.device_id), self.stream:
            yield

    def is_array(self, x) -> bool:
        return isinstance(x, self.cp.ndarray)

    def on_this_device(self, x) -> bool:
        return int(x.device.id) == self.device_id

    def empty(self, shape, dtype):
        with self.scope():
            return self.cp.empty(tuple(shape), dtype=dtype)

    def pointer(self, x) -> int:
        if x.size == 0:
            return int(self._sentinel.data.ptr)
        return int(x.data.ptr)

    def contiguous(self, x):
        if x.flags.c_contiguous:
            return x
        with self.scope():
            if x.dtype.name == "bfloat16":  # move the bits: no bfloat16 kernels needed
                return self.cp.ascontiguousarray(x.view(self.cp.uint16)).view(x.dtype)
            return self.cp.ascontiguousarray(x)

    def copy_into(self, dst, src) -> None:
        """Device to device, asynchronous on the stream; ``src`` C-contiguous, same bytes."""
        if src.nbytes:
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(int(dst.data.ptr), int(src.data.ptr), int(src.nbytes),
                           rt.memcpyDeviceToDevice, self.stream.ptr)

    def poison(self, x) -> None:
        """Fill with 0xFF bytes: NaN in every float type, -1 in every signed integer."""
        if x.nbytes:
            self.cp.cuda.runtime.memsetAsync(int(x.data.ptr), 0xFF, int(x.nbytes),
                                             self.stream.ptr)

    def wrap(self, owner, ortvalue, shape: tuple[int, ...], dtype: np.dtype):
        """A CuPy array over an onnxruntime-allocated device tensor, no copy; the array
        keeps ``owner`` (the binding and the ``OrtValue``, so the memory) alive."""
        cp = self.cp
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return self.empty(shape, dtype)
        mem = cp.cuda.UnownedMemory(int(ortvalue.data_ptr()), nbytes, owner, self.device_id)
        return cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))


class HostMemory:
    """The same contract over numpy, for running the binding logic on onnxruntime's CPU
    provider (CI has no GPU): same pointers-and-fixed-buffers code, host addresses."""

    device_type = "cpu"
    device_id = 0
    residency = "host"

    def __init__(self):
        self._sentinel = np.empty((EMPTY_SENTINEL_BYTES,), dtype=np.uint8)

    def scope(self):
        return contextlib.nullcontext()

    def is_array(self, x) -> bool:
        return isinstance(x, np.ndarray) and x.size > 0

    def on_this_device(self, x) -> bool:
        return True

    def empty(self, shape, dtype):
        return np.empty(tuple(shape), dtype=dtype)

    def pointer(self, x) -> int:
        return int((self._sentinel if x.size == 0 else x).ctypes.data)

    def contiguous(self, x):
        return np.ascontiguousarray(x)

    def copy_into(self, dst, src) -> None:
        np.copyto(dst, src)

    def poison(self, x) -> None:
        x.reshape(-1).view(np.uint8).fill(0xFF)

    def wrap(self, owner, ortvalue, shape, dtype):
        return ortvalue.numpy()


# -- one component, bound by pointer ---------------------------------------------------------
class _FixedBuffers:
    """A graph session's inputs and outputs, bound once: the addresses never change."""

    def __init__(self, signature, binding, inputs: dict[str, Any], outputs: dict[str, Any]):
        self.signature = signature
        self.binding = binding
        self.inputs = inputs
        self.outputs = outputs
        self.runs = 0


class IoBoundComponent:
    """One component's sessions: an eager one (IO binding per forward) and optionally a
    CUDA-graph one for its decode steps (fixed buffers, bound once)."""

    def __init__(self, name: str, model: onnx.ModelProto, width_input: str | None, memory,
                 session, graph_session=None, graph_refusal: str | None = None,
                 poison_graph_outputs: bool = False):
        self.name = name
        self.memory = memory
        self.session = session
        self.width_input = width_input
        self.graph_session = graph_session
        self.graph_refusal = graph_refusal
        self.poison_graph_outputs = poison_graph_outputs
        self.fixed: _FixedBuffers | None = None
        self.input_names = [i.name for i in model.graph.input]
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [n for n in self.input_names if n not in inits]
        self.input_dims = {i.name: value_dims(i) for i in model.graph.input
                           if i.name in self.input_names}
        self.output_names = [o.name for o in model.graph.output]
        self.output_dims = {o.name: value_dims(o) for o in model.graph.output}
        self.output_dtypes = {o.name: numpy_dtype(o.type.tensor_type.elem_type)
                              for o in model.graph.output}

    @property
    def graph_enabled(self) -> bool:
        return self.graph_session is not None or self.graph_refusal is not None

    # -- feeds -------------------------------------------------------------------------------
    def _bindable(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Every graph input, as a C-contiguous array on the device (or host-empty)."""
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"component {self.name!r} has no graph input {unknown[0]!r}",
                             field="feeds", value=unknown,
                             remedy=f"feed exactly: {', '.join(self.input_names)}")
        mem = self.memory
        out = {}
        for name in self.input_names:
            if name not in feeds:
                raise InputError(f"component {self.name!r} needs the graph input {name!r}",
                                 field=f"feeds[{name!r}]", remedy="feed every graph input")
            x = feeds[name]
            if mem.is_array(x):
                if not mem.on_this_device(x):
                    raise ResidencyError(f"feed {name!r} lives on another device",
                                         field=f"feeds[{name!r}]", value=str(x.device),
                                         remedy=f"adopt it on {mem.residency}")
                out[name] = mem.contiguous(x)
            elif isinstance(x, np.ndarray) and x.size == 0:
                out[name] = x  # host-empty: bound to the sentinel, nothing crosses
            else:
                raise ResidencyError(f"feed {name!r} is a host {type(x).__name__}; this engine "
                                     f"binds device memory on {mem.residency}",
                                     field=f"feeds[{name!r}]", value=type(x).__name__,
                                     remedy="adopt it first: engine.tensor_ops.adopt(array)")
        return out

    def _bind_input(self, binding, name: str, x) -> None:
        mem = self.memory
        binding.bind_input(name, mem.device_type, mem.device_id, binding_type(x.dtype),
                           list(x.shape), mem.pointer(x))

    def _bind_output(self, binding, name: str, buf) -> None:
        mem = self.memory
        binding.bind_output(name, mem.device_type, mem.device_id, binding_type(buf.dtype),
                            list(buf.shape), mem.pointer(buf))

    def decode_step(self, feeds: dict[str, Any]) -> bool:
        """A graph-eligible forward: one new position (the width input's M is 1)."""
        x = feeds.get(self.width_input) if self.width_input else None
        return x is not None and len(x.shape) >= 2 and int(x.shape[1]) == 1

    # -- eager -------------------------------------------------------------------------------
    def run_eager(self, feeds: dict[str, Any]) -> dict[str, Any]:
        mem = self.memory
        bound = self._bindable(feeds)
        # A fresh binding per forward, never cleared or rerun: onnxruntime-allocated outputs
        # are OrtValues inside it, and the CuPy arrays wrapping them keep it alive.
        binding = self.session.io_binding()
        for name, x in bound.items():
            self._bind_input(binding, name, x)
        shapes = resolve_output_shapes(self.input_dims, self.output_dims,
                                       {n: tuple(x.shape) for n, x in bound.items()})
        fresh: dict[str, Any] = {}
        for name in self.output_names:
            shape = shapes[name]
            if shape is None:
                binding.bind_output(name, mem.device_type, mem.device_id)  # onnxruntime allocates
            else:
                fresh[name] = mem.empty(shape, self.output_dtypes[name])
                self._bind_output(binding, name, fresh[name])
        try:
            with mem.scope():
                self.session.run_with_iobinding(binding)
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed to run {self.name!r}: {exc}",
                                 field="component", value=self.name) from exc
        result: dict[str, Any] = {}
        values = None
        for index, name in enumerate(self.output_names):
            if name in fresh:
                result[name] = fresh[name]
                continue
            if values is None:
                values = binding.get_outputs()
            value = values[index]
            result[name] = mem.wrap((binding, value), value,
                                    tuple(int(d) for d in value.shape()),
                                    self.output_dtypes[name])
        return result

    # -- CUDA graph ----------------------------------------------------------------------------
    def _fix_buffers(self, bound: dict[str, Any]) -> _FixedBuffers | str:
        """Allocate and bind the graph session's buffers for this signature, once; a string
        says why it cannot be (an output whose shape the inputs do not fix)."""
        mem = self.memory
        shapes = resolve_output_shapes(self.input_dims, self.output_dims,
                                       {n: tuple(x.shape) for n, x in bound.items()})
        missing = [n for n, s in shapes.items() if s is None]
        if missing:
            return (f"output {missing[0]!r} has no shape fixed by the inputs "
                    f"(declared {self.output_dims[missing[0]]})")
        inputs = {n: mem.empty(x.shape, x.dtype) for n, x in bound.items()}
        outputs = {n: mem.empty(shapes[n], self.output_dtypes[n]) for n in self.output_names}
        binding = self.graph_session.io_binding()
        for name, buf in inputs.items():
            self._bind_input(binding, name, buf)
        for name, buf in outputs.items():
            self._bind_output(binding, name, buf)
        return _FixedBuffers(_signature(bound), binding, inputs, outputs)

    def run_graph(self, feeds: dict[str, Any], slot) -> dict[str, Any] | None:
        """A decode step on the graph session; None when it must run eagerly (counted)."""
        if self.graph_session is None:
            slot.fallbacks += 1
            return None
        mem = self.memory
        bound = self._bindable(feeds)
        if self.fixed is None:
            fixed = self._fix_buffers(bound)
            if isinstance(fixed, str):
                self.graph_refusal = fixed
                self.graph_session = None
                slot.fallbacks += 1
                return None
            self.fixed = fixed
        fixed = self.fixed
        if _signature(bound) != fixed.signature:
            slot.fallbacks += 1
            return None
        for name, x in bound.items():
            mem.copy_into(fixed.inputs[name], x)
        if self.poison_graph_outputs:
            for buf in fixed.outputs.values():
                mem.poison(buf)
        runs = CAPTURE_RUNS if fixed.runs == 0 else 1
        try:
            with mem.scope():
                for _ in range(runs):
                    self.graph_session.run_with_iobinding(fixed.binding)
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed to run {self.name!r} on its CUDA-graph "
                                 f"session: {exc}", field="component", value=self.name,
                                 remedy="run with cuda_graph=False to compare") from exc
        if fixed.runs == 0:
            slot.captures += 1
        else:
            slot.replays += 1
        fixed.runs += 1
        return dict(fixed.outputs)

    def run(self, feeds: dict[str, Any], ledger) -> dict[str, Any]:
        if self.graph_enabled and self.decode_step(feeds):
            out = self.run_graph(feeds, ledger.slot(slot_name(self.name)))
            if out is not None:
                return out
        return self.run_eager(feeds)


def _signature(bound: dict[str, Any]) -> tuple:
    return tuple((n, tuple(int(d) for d in x.shape), x.dtype.str) for n, x in bound.items())


def width_input(spec, component: str) -> str | None:
    """The graph input whose axis 1 is the number of new positions M."""
    inputs = spec.components[component].inputs
    for role in WIDTH_ROLES:
        if role in inputs:
            return inputs[role]
    return None


def count_memcpy_nodes(model_path: Path) -> dict[str, int]:
    """MemcpyToHost / MemcpyFromHost nodes onnxruntime inserted, from its saved graph."""
    model = onnx.load(str(model_path), load_external_data=False)
    counts = {"MemcpyToHost": 0, "MemcpyFromHost": 0}
    for node in model.graph.node:
        if node.op_type in counts:
            counts[node.op_type] += 1
    return counts


# -- the engine ------------------------------------------------------------------------------
def _probe() -> tuple[bool, str, str]:
    """(ok, reason, remedy)."""
    providers = list(ort.get_available_providers())
    if PROVIDER not in providers:
        return False, (f"onnxruntime {ort.__version__} has no {PROVIDER} (providers: "
                       f"{', '.join(providers)}): the CPU-only onnxruntime package is "
                       f"installed, not onnxruntime-gpu"), REMEDY
    ok, reason = cuda_availability()
    if not ok:
        return False, reason, CUPY_REMEDY
    return True, f"onnxruntime {ort.__version__} with {PROVIDER}; {reason}", ""


class OrtCudaEngine(Engine):
    name = "ort-cuda"
    residency = "cuda:0"
    graph_slots = True  # onnxruntime's CUDA graphs, counted in ledger.slot(...)
    description = "onnxruntime CUDAExecutionProvider, IO binding on the engine's stream"
    device_id: ClassVar[int] = 0

    @classmethod
    def availability(cls) -> Availability:
        ok, reason, _ = _probe()
        return Availability(ok, reason)

    def __init__(self, package, *, cuda_graph: bool | None = None,
                 poison_graph_outputs: bool = False, log_severity_level: int = 3,
                 audit_memcpy: bool = True):
        """``cuda_graph``: None = on for static packages; True on a package with an append
        cache is an ``InputError``. ``poison_graph_outputs`` fills the fixed outputs with
        NaN before every graph run (tests: a replay that writes nothing cannot pass).
        ``log_severity_level``: onnxruntime's (0 verbose .. 4 fatal) for these sessions."""
        ok, reason, remedy = _probe()
        if not ok:
            raise EngineUnavailable(f"ort-cuda is unavailable: {reason}", field="engine",
                                    value=self.name, remedy=remedy)
        static = is_static_package(package.spec)
        if cuda_graph and not static:
            grows = [n for n, c in package.spec.state.items() if c.update == "append"]
            raise InputError("CUDA graphs need fixed shapes; this package has append kv cells",
                             field="cuda_graph", value=True,
                             remedy=f"use cuda_graph=False, or a static package (append: "
                                    f"{', '.join(grows)})")
        cupy = import_cupy()
        self._cupy = cupy
        with cupy.cuda.Device(self.device_id):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.components: dict[str, IoBoundComponent] = {}
        super().__init__(package)  # tensor ops on self.stream
        self._ort = ort
        self.cuda_graph = static if cuda_graph is None else bool(cuda_graph)
        self.log_severity_level = int(log_severity_level)
        self.memory = CudaMemory(cupy, self.device_id, self.stream)
        self.memcpy_nodes: dict[str, dict[str, int] | None] = {}
        self.graph_refusals: dict[str, str] = {}
        self.audit_errors: dict[str, str] = {}
        for name in package.spec.components:
            path = package.component_path(name)
            try:
                session, audit = self._session(path, graph=False, audit=audit_memcpy)
            except EngineUnavailable:
                raise
            except Exception as exc:
                if not audit_memcpy:
                    raise
                # saving the optimized graph failed: run unaudited, and say why
                self.audit_errors[name] = f"{type(exc).__name__}: {exc}"
                session, audit = self._session(path, graph=False, audit=False)
            self.memcpy_nodes[name] = audit
            graph_session = refusal = None
            if self.cuda_graph:
                try:
                    graph_session, _ = self._session(path, graph=True, audit=False)
                except EngineUnavailable:
                    raise
                except Exception as exc:  # onnxruntime refused: eager, counted as fallbacks
                    refusal = f"{type(exc).__name__}: {exc}"
                    self.graph_refusals[name] = refusal
            self.components[name] = IoBoundComponent(
                name, package.component_model(name), width_input(package.spec, name),
                self.memory, session, graph_session, refusal, poison_graph_outputs)

    def make_tensor_ops(self):
        return CudaTensorOps(self.ledger, self.stream, device_id=self.device_id)

    def _session(self, path: Path, graph: bool, audit: bool):
        ort = self._ort
        options = ort.SessionOptions()
        options.log_severity_level = self.log_severity_level
        if graph:
            options.enable_mem_pattern = False  # no allocation may happen while capturing
        # use_tf32 0: float32 means IEEE float32. With onnxruntime's default (TF32 on), the
        # H200 gave tiny_llama logits up to 0.018 away from ort-cpu: matmul inputs rounded to
        # a 10-bit mantissa, which is a different engine than the package declares.
        provider = {"user_compute_stream": str(int(self.stream.ptr)),
                    "do_copy_in_default_stream": "1",
                    "use_tf32": "0"}
        # device_id only when it is not the default 0: onnxruntime >= 1.26 takes an explicit
        # device_id as a request for a plugin EP device and warns at every session creation.
        if self.device_id:
            provider["device_id"] = str(self.device_id)
        if graph:
            provider["enable_cuda_graph"] = "1"
        with contextlib.ExitStack() as stack:
            saved = None
            if audit:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                saved = folder / "optimized.onnx"
                options.optimized_model_filepath = str(saved)
            try:
                session = ort.InferenceSession(str(path), sess_options=options,
                                               providers=[(PROVIDER, provider)])
            except Exception as exc:  # a provider without a kernel: the package, not a crash
                gap = kernel_gap_unavailable(exc, self.name, path.name, self.package.spec.dtype)
                if gap is not None:
                    raise gap from exc
                raise
            if PROVIDER not in session.get_providers():
                raise EngineUnavailable(
                    f"onnxruntime created the session for {path.name} without {PROVIDER} "
                    f"(got {', '.join(session.get_providers())}): its CUDA libraries did not "
                    f"load", field="engine", value=self.name, remedy=REMEDY)
            counts = count_memcpy_nodes(saved) if saved is not None and saved.exists() else None
        return session, counts

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        """One forward of ``component``; feeds and results are device arrays keyed by graph
        names. ``phase`` is accepted for symmetry with the interpreter and not needed."""
        comp = self.components.get(component)
        if comp is None:
            raise InputError(f"the package has no component {component!r}", field="component",
                             value=component, remedy=f"use one of: {', '.join(self.components)}")
        out = comp.run(feeds, self.ledger)
        staged = (self.memcpy_nodes.get(component) or {}).get("MemcpyToHost", 0)
        for _ in range(staged):  # onnxruntime's own device-to-host copies, bytes unseen
            self.ledger.record_staging(0, f"onnxruntime MemcpyToHost node in {component!r}")
        return out

    def synchronize(self) -> None:
        """Wait for everything queued on the engine's stream."""
        self.stream.synchronize()

    def close(self) -> None:
        """Wait for the stream's queued work, then drop the sessions and their buffers."""
        if self.components:
            self.stream.synchronize()
        self.components = {}

