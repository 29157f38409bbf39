"""The engine contract: what lockstep asks of every engine, built in or third party.

An engine loads one package once and either

* **runs its components** (``run_component``): the workflow interpreter
  (``engines.workflow``) then drives it step by step, owning the state cells, the token
  choice and speculation, exactly as it drives every built-in engine; or
* **decodes by itself** (``decodes_itself = True`` and ``generate``): a black box such as
  transformers' ``generate``; the interpreter hands it the whole request and judges what it
  returns. :class:`BlackBoxEngine` is the base for engines that only generate.

Everything lockstep needs to know about an engine is declared here, on the class: the
methods below (with their defaults: ``availability`` on this machine, ``supports`` for a
package) and the capabilities (:class:`Capabilities`, from the
class attributes ``residency``, ``batch_invariant``, ``graph_slots``, ``speculative``,
``logits_audit``, ``decodes_itself``). The interpreter, the runner and the bench read these
declarations; they never probe an engine with ``inspect`` or ``getattr``.
``docs/ENGINES.md`` is the guide to writing, registering and testing an engine.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from engines.errors import EngineUnavailable, ExecutionError
from engines.ledger import Ledger

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from engines.decode_result import DecodeResult
    from engines.package import Package
    from engines.tensor_ops.base import TensorOps


@dataclass(frozen=True)
class Availability:
    """Whether an engine can run here; ``reason`` says why not (or what it found)."""
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Capabilities:
    """What an engine declares about itself (``Engine.capabilities()``).

    residency       where its values live: ``"host"`` or ``"cuda:N"``. A device engine's
                    decodes are judged for host staging and the exact readback budget.
    graph_slots     it captures and replays CUDA graphs and counts them in
                    ``ledger.slot(name)`` (claim ``graph_replay``).
    speculative     the interpreter may run speculative decoding on it (its components can
                    run any number of positions on carried state). False: speculative cells
                    are ``unavailable`` for it, with this reason.
    logits_audit    it can return each step's logits row (``DecodeResult.logits``) for the
                    logits audit. False: the audit is skipped and the cell says so.
    decodes_itself  the interpreter calls ``generate`` instead of driving ``run_component``.
    batch_invariant row i of an M-row forward equals the M=1 forward bit for bit, so its
                    speculative stream must equal its greedy stream exactly (claim 2).
    logprobs_audit  it returns each step's top-k log-probabilities with their ids
                    (``DecodeResult.top_logprobs``) where it cannot return whole rows: the
                    runner audits those against the oracle's log-softmax (a top-k audit).
    concurrent      it can decode several prompts at once (``generate_concurrent``): a
                    server that batches what arrives together. ``lockstep run
                    --concurrency N`` judges it for claim ``concurrency_invariance``.
    """
    residency: str
    graph_slots: bool
    speculative: bool
    logits_audit: bool
    decodes_itself: bool
    batch_invariant: bool
    logprobs_audit: bool = False
    concurrent: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def flags(self) -> list[str]:
        """The names of the boolean capabilities that are set, in declaration order."""
        return [k for k, v in asdict(self).items() if v is True]


class Engine(abc.ABC):
    """One engine instance holds one package's components, loaded once.

    Subclasses set ``name`` (their own; the registry refuses an inherited one), implement
    ``availability`` and ``run_component`` (or ``generate`` with ``decodes_itself``), and
    declare their capabilities as class attributes. Errors: raise
    :class:`engines.errors.EngineUnavailable` from the constructor for a package this engine
    cannot load (the cell is then ``unavailable``), and where the package alone decides it,
    say so in ``supports`` too, so runs leave those cells out before they start; any other
    exception, lockstep's own or not, becomes that cell's ``error`` record, and the matrix
    goes on.
    """

    #: the name results are recorded under; every class sets its own
    name: ClassVar[str]
    #: one line for ``lockstep engines`` and the report
    description: ClassVar[str] = ""
    # -- capabilities (see Capabilities) ---------------------------------------------------
    residency: ClassVar[str] = "host"
    batch_invariant: ClassVar[bool] = False
    graph_slots: ClassVar[bool] = False
    speculative: ClassVar[bool] = True
    logits_audit: ClassVar[bool] = True
    decodes_itself: ClassVar[bool] = False
    logprobs_audit: ClassVar[bool] = False
    concurrent: ClassVar[bool] = False
    #: the ways ``teacher_forced`` can feed a sequence (piece lengths, None: all at once):
    #: the batch shapes ``lockstep calibrate`` measures it in; empty: it cannot be calibrated
    batch_shapes: ClassVar[tuple[int | None, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # ``_make_tensor_ops`` was the hook's name before it was public: a subclass that
        # still overrides only the old name keeps working.
        own = cls.__dict__
        if "_make_tensor_ops" in own and "make_tensor_ops" not in own:
            cls.make_tensor_ops = own["_make_tensor_ops"]

    def __init__(self, package: "Package"):
        """Load every component of ``package`` once (subclasses call this first, or after
        creating what ``make_tensor_ops`` needs, such as a stream)."""
        self.package = package
        #: this engine's counters: crossings, forwards per phase, graph slots, speculation
        self.ledger: Ledger = Ledger()
        #: how values are made, narrowed and chosen where this engine lives
        self.tensor_ops: TensorOps = self.make_tensor_ops()

    # -- declarations ----------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def availability(cls) -> Availability:
        """Whether this engine can run here, and if not, why (missing dependency, no device).
        Cheap and side-effect free: ``lockstep engines`` and every run call it."""

    @classmethod
    def supports(cls, package: "Package") -> Availability:
        """Whether this engine can load ``package``, decided from the package alone (its
        dtype, its files), never from this machine: a run plans with it, so every machine
        plans the same cells, and leaves out (with this reason) the packages it refuses.
        The constructor raises :class:`engines.errors.EngineUnavailable` for each of them.
        Cheap and side-effect free. Default: every package (refusals that depend on the
        machine, such as a kernel the GPU lacks, stay the constructor's)."""
        return Availability(True)

    @classmethod
    def check_settings(cls) -> None:
        """The environment variables the engine will read, checked when it is named in a
        list to run (``engines.registry.resolve_engine_list``), before any cell: a bad one is
        an ``InputError`` naming the variable, not a cell error after the run. Default: the
        engine reads none."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        """The engine's declared capabilities, from its class attributes."""
        return Capabilities(residency=cls.residency, graph_slots=cls.graph_slots,
                            speculative=cls.speculative, logits_audit=cls.logits_audit,
                            decodes_itself=cls.decodes_itself,
                            batch_invariant=cls.batch_invariant,
                            logprobs_audit=cls.logprobs_audit, concurrent=cls.concurrent)

    # -- ledger and tensor ops -------------------------------------------------------------
    def make_tensor_ops(self) -> "TensorOps":
        """The tensor ops bound to ``self.ledger`` (called at construction and by
        ``reset_ledger``). The default works on the host with numpy; a device engine
        returns its own (``CudaTensorOps`` on its stream)."""
        # imported here: the tensor ops load ml_dtypes (about 0.6 s), which importing the
        # registry, as every lockstep command does, should not pay
        from engines.tensor_ops.host import HostTensorOps

        return HostTensorOps(self.ledger)

    def _make_tensor_ops(self) -> "TensorOps":
        """The former name of :meth:`make_tensor_ops`, kept as an alias."""
        return self.make_tensor_ops()

    def reset_ledger(self) -> Ledger:
        """Start a fresh ledger (the interpreter calls this before every decode) and rebind
        the tensor ops to it; returns the new ledger."""
        self.ledger = Ledger()
        self.tensor_ops = self.make_tensor_ops()
        return self.ledger

    # -- running ---------------------------------------------------------------------------
    @abc.abstractmethod
    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        """Run one forward of ``component`` over the positions fed.

        ``feeds`` and the result are keyed by ONNX graph input/output names; values live
        where the engine lives (``residency``): numpy arrays on the host, device arrays
        otherwise, made with ``tensor_ops``. The interpreter always passes ``phase``
        (``prefill``, ``decode``, ``propose``, ``verify``, ``readvance``); the oracle calls
        with none. An engine may use it (graph slots do) or ignore it."""

    def generate(self, prompt: Sequence[int], max_new_tokens: int,
                 audit: bool = False, ignore_eos: bool = False) -> "DecodeResult":
        """Decode greedily by the engine's own loop (only with ``decodes_itself``).

        ``prompt`` has been validated against the package (``engines.requests``). Return a
        :class:`engines.decode_result.DecodeResult`: the generated ids (stopping after eos or
        at ``max_new_tokens``), a fresh ledger (``self.reset_ledger()``, with the forwards
        recorded where known), the wall time and, with ``audit`` where the engine can
        (``logits_audit``), each step's logits row as host float64. ``ignore_eos`` is for
        timing only (``lockstep bench --ignore-eos``; a parity run never sets it): go on past
        eos and return exactly ``max_new_tokens`` tokens, so every engine is timed on as many."""
        raise NotImplementedError(
            f"engine {type(self).__name__} does not decode by itself: the workflow interpreter "
            f"drives its run_component (set decodes_itself = True and implement generate for "
            f"a black-box engine)")

    def generate_concurrent(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                            audit: bool = False) -> "list[DecodeResult]":
        """Decode every prompt of ``prompts`` greedily with all of them in flight at once
        (only with ``concurrent``): one result per prompt, in order, each as ``generate``
        returns it. What a server computes for a prompt among others must equal what it
        computes for the prompt alone (claim ``concurrency_invariance``)."""
        raise NotImplementedError(
            f"engine {type(self).__name__} does not decode concurrently (set concurrent = "
            f"True and implement generate_concurrent)")

    def attach_evidence(self, folder: Path) -> None:
        """Where this engine may keep files that belong with the run's evidence (a server's
        log), named in its ``provenance()``; the runner calls it once after construction when
        the run writes evidence. The default keeps nothing."""

    def provenance(self) -> dict[str, Any]:
        """What this instance runs when it is not the package's own components: an engine
        that builds its model from the checkpoint (``hf``, ``ort-genai``) names the loader
        or builder, its version, the precision and the checkpoint's content hash, so a
        record can say which conversion each side ran. Default: empty (the package's
        components, which the package's content hash already names)."""
        return {}

    @classmethod
    def for_speed(cls, package: "Package") -> "Engine":
        """The instance ``lockstep bench`` times on ``package``: by default the one parity
        runs use, ``cls(package)``. An engine whose parity runs choose otherwise than it is
        run for speed returns its speed configuration here (``hf-cuda`` computes a bfloat16
        package in bfloat16 for speed and in float32 for parity); the bench row names what
        it computed in (:meth:`compute_dtype`)."""
        return cls(package)

    def compute_dtype(self) -> str:
        """The dtype this instance computes in, as bench rows and records name it: the
        package's dtype by default (a mixed-precision package's: its weights, matmuls and
        logits), the quantized scheme where the engine declares one; an engine that builds
        its own model names the dtype it cast that model to."""
        return self.numeric_scheme() or self.package.spec.dtype

    def numeric_scheme(self) -> str | None:
        """The numeric scheme the engine computes in where that is not the package's dtype:
        quantized weights or activations (``ggml-cpu:q4_1``: ggml's CPU kernels on Q4_1
        weights, which quantize the activations they meet too). A declared scheme is judged by
        its calibrated band (``engines.tolerances.band_for``: near-tie margin, per-step logits
        bounds, stream statistics) against the float32 oracle over the engine's own
        dequantized weights (``reference_package``), never by float32 identity. Default None:
        the package's dtype row."""
        return None

    def reference_package(self) -> "Path | None":
        """The float32 package over this engine's own dequantized weights, where that is not
        the package it was given (an engine that quantizes the checkpoint itself, such as an
        int4 build); the oracle that judges it runs this package. Default None: the package
        (or the float32 twin it declares) is the reference."""
        return None

    def teacher_forced(self, ids: Sequence[int], chunk: int | None = None
                       ) -> tuple[list[int], Any]:
        """Score ``ids`` as given (teacher-forced, from an empty cache), fed in pieces of
        ``chunk`` positions (one of ``batch_shapes``; None: all at once): the positions whose
        logits row the engine exposes and those rows, float32 or float64 ``[n, vocab]`` on the
        host. ``lockstep calibrate`` measures a quantized scheme's band with it. Only engines
        that declare ``batch_shapes`` implement it."""
        raise EngineUnavailable(
            f"engine {self.name!r} scores no teacher-forced sequence (it declares no "
            f"batch_shapes)", field="engine", value=self.name,
            remedy="calibrate an engine that implements teacher_forced, such as llama-cpp")

    def synchronize(self) -> None:
        """Wait until everything the engine has queued has finished (the bench times
        between two calls). The default has nothing queued; a device engine waits for its
        stream."""

    def close(self) -> None:
        """Release what the engine holds; the default holds nothing that needs it. Called
        once after the engine's last cell, also when a cell failed."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BlackBoxEngine(Engine):
    """An engine that only generates: the interpreter calls ``generate`` for every decode
    and never runs one of its components, so it cannot speculate under lockstep's control.
    Subclasses implement ``availability`` and ``generate``."""

    decodes_itself: ClassVar[bool] = True
    speculative: ClassVar[bool] = False

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        raise ExecutionError(f"engine {self.name!r} decodes by itself (a black box): it runs "
                             f"no single component", field="component", value=component,
                             remedy="decode through engines.workflow.greedy_decode, which calls "
                                    "its generate")

    @abc.abstractmethod
    def generate(self, prompt: Sequence[int], max_new_tokens: int,
                 audit: bool = False, ignore_eos: bool = False) -> "DecodeResult":
        """See :meth:`Engine.generate`."""


__all__ = ["Availability", "BlackBoxEngine", "Capabilities", "Engine"]
