"""``hf``: transformers' own model, built from the checkpoint the package was converted from.

The independent reference: none of lockstep's converter, graph or executor code computes
its logits. The package's ``checkpoint.json`` names its source checkpoint (found again by
``checkpoint_source``, verified by content hash); hf builds the model from *that*, the way
transformers itself would: a GGUF through transformers' GGUF loader (its configuration,
its dequantisation, its un-permutation of the Q/K rows), a Hugging Face folder from its
``config.json`` and its own architecture class. So a configuration field the converter
ignores or mishandles is one hf honours, and the two disagree (the verdict catches it)
instead of agreeing on a wrong model. Where the checkpoint cannot be found, hf falls back
to the package's own weights under the converter's record and says so
(:meth:`HfEngine.provenance`, a warning).

The model is built by ``hf_model``; this module runs it. It decodes itself
(``decodes_itself``): ``generate(prompt, max_new_tokens)`` runs
transformers' ``generate`` (greedy, its own KV cache) and returns a ``DecodeResult``; the
interpreter calls it instead of driving the components. It declares no speculative decoding.
``run_component`` serves the oracle: a from-scratch forward over the whole prefix (fresh
state only), returning logits and the final hidden state.

``hf-cuda`` (:class:`HfCudaEngine`) is the same model on the GPU as a peer for speed and
parity: device ``cuda:0``, transformers' static cache (``generate(...,
cache_implementation="static")``, which transformers compiles with ``torch.compile`` on a
CUDA device unless ``torch_compile=False``), transformers' default SDPA attention, float16 for a
float16 package and float32 otherwise (or the ``dtype`` given to the constructor; the bench
builds it in the package's own dtype, ``for_speed``, bfloat16 included). It is a
black box like ``hf``: its residency is declared ``cuda:0`` because its weights, cache and
logits live there (the bench measures that device's copy bandwidth for its floor, and the
runner audits its logits in a separate decode); lockstep judges no device budgets for an
engine that decodes by itself.
``synchronize()`` waits for the device (``torch.cuda.synchronize``) so the bench's clock
covers its work.
"""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from engines.backends.checkpoint_source import CheckpointSource, content_hash, find_checkpoint
from engines.backends.hf_model import build_model
from engines.backends.transformers_quiet import quiet_transformers
from engines.decode_result import DecodeResult
from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError
from engines.requests import check_request

SIDECAR = "checkpoint.json"
INSTALL = "pip install 'lockstep[hf]' (torch==2.13.0 CPU and transformers)"
INSTALL_CUDA = ("install a CUDA build of torch (pip install torch --index-url "
                "https://download.pytorch.org/whl/cu130) and transformers, on a machine with a GPU")
# the package dtype names hf accepts, and the torch dtype each computes in
DTYPES = ("float32", "float16", "bfloat16")


class HfEngine(Engine):
    name = "hf"
    residency = "host"
    decodes_itself = True  # through transformers' generate
    speculative = False    # its components run from scratch only (see run_component)
    logits_audit = True    # generate's output_logits
    description = "transformers' LLaMA/Qwen2 (eager attention), greedy through generate"
    #: the torch device the model runs on
    device: ClassVar[str] = "cpu"
    #: transformers' static cache (``cache_implementation="static"``) instead of its dynamic one
    static_cache: ClassVar[bool] = False
    #: transformers' attention implementation (eager: the plain reference arithmetic)
    attention: ClassVar[str] = "eager"

    @classmethod
    def availability(cls) -> Availability:
        try:
            import torch
            import transformers
        except ImportError as exc:
            return Availability(False, f"{exc.name} is not installed; {INSTALL}")
        return Availability(True, f"transformers {transformers.__version__}, "
                                  f"torch {torch.__version__}")

    @classmethod
    def supports(cls, package) -> Availability:
        """Packages converted from a checkpoint (their ``checkpoint.json``): transformers builds
        its model from that checkpoint; a fixture built from a seed has none."""
        if not (package.root / SIDECAR).is_file():
            return Availability(False, f"{cls.name} builds its model from the package's source "
                                       f"checkpoint; this package has no {SIDECAR} (a fixture "
                                       f"built from a seed has no transformers counterpart)")
        return Availability(True)

    @classmethod
    def default_dtype(cls, package_dtype: str) -> str:
        """The dtype transformers computes in when the constructor is given none: the
        package's own."""
        return package_dtype

    def __init__(self, package, *, dtype: str | None = None, static_cache: bool | None = None,
                 torch_compile: bool = True, checkpoint=None):
        """``dtype``: float32, float16 or bfloat16 (default :meth:`default_dtype` of the
        package's dtype); the checkpoint's weights are loaded in float32 (exact from float16
        and bfloat16) and then cast to it. ``static_cache``: transformers' static cache
        (default: the class's ``static_cache``). ``torch_compile=False`` passes
        ``disable_compile`` to ``generate`` (transformers otherwise compiles the forward of a
        static-cache decode on CUDA). ``checkpoint``: the source checkpoint (a path or a
        ``CheckpointSource``; default: the one ``checkpoint.json`` names, found by
        ``engines.backends.checkpoint_source``)."""
        super().__init__(package)
        import torch

        self._torch = torch
        self.torch_device = torch.device(self.device)
        if self.torch_device.type == "cuda":
            found = cuda_availability(torch)
            if not found.ok:
                raise EngineUnavailable(f"{self.name} needs CUDA: {found.reason}",
                                        field="engine", value=self.name, remedy=INSTALL_CUDA)
        if self.torch_device.type == "cpu":
            # One intra-op thread, as ort-cpu: on a shared 2-core runner (pytest -n 2) torch's
            # OpenMP threads otherwise spin against each other, ten times slower. Process-wide.
            torch.set_num_threads(1)
        found = self.supports(package)
        if not found:
            raise EngineUnavailable(
                found.reason, field="package", value=str(package.root),
                remedy="convert a checkpoint with lockstep convert (fixtures built from seeds "
                       "have no transformers counterpart)")
        self.sidecar = json.loads((package.root / SIDECAR).read_text())
        chosen = dtype if dtype is not None else self.default_dtype(package.spec.dtype)
        if chosen not in DTYPES:
            raise (InputError if dtype is not None else EngineUnavailable)(
                f"{self.name} computes in {', '.join(DTYPES)}, not {chosen!r}", field="dtype",
                value=chosen, remedy=f"give dtype= one of {', '.join(DTYPES)}")
        self.dtype_name = chosen
        self.dtype = getattr(torch, chosen)
        self.use_static_cache = self.static_cache if static_cache is None else bool(static_cache)
        self.torch_compile = bool(torch_compile)
        self._fallback, self._provenance = "", {}
        self.source = self._locate(checkpoint)
        with quiet_transformers():
            self.model = self._build_model()
        comp = package.spec.components["target"]
        self._ports = dict(comp.inputs), dict(comp.outputs)

    # -- loading -------------------------------------------------------------------------
    def _locate(self, checkpoint):
        """The verified source checkpoint, or None (with a warning) where it cannot be found:
        then the model is built from the package's weights under the converter's record."""
        if isinstance(checkpoint, CheckpointSource):
            return checkpoint
        if checkpoint is not None:
            path = Path(checkpoint).expanduser()
            return CheckpointSource(path, "gguf" if path.is_file() else "hf",
                                    content_hash(path))
        try:
            return find_checkpoint(self.package.root, self.name)
        except EngineUnavailable as exc:
            self._fallback = str(exc)
            warnings.warn(f"{self.name}: {exc}; building from the package's weights under the "
                          f"converter's record instead", stacklevel=3)
            return None

    def provenance(self) -> dict[str, Any]:
        """The conversion hf ran: transformers' own loader on the source checkpoint (its path,
        kind and content hash), or the package's weights where that was not found; and the
        dtype it computed in."""
        return dict(self._provenance)

    def compute_dtype(self) -> str:
        """The torch dtype the model was cast to (``dtype``, or :meth:`default_dtype`)."""
        return self.dtype_name

    def _build_model(self):
        """transformers' model (``hf_model.build_model``) in this engine's dtype, on its
        device, set to decode greedily."""
        import transformers

        model, self._provenance = build_model(self.source, self.package, self.sidecar,
                                              self.attention, self._fallback)
        self._provenance["dtype"] = self.dtype_name  # a record says what it computed in
        spec = self.package.spec
        if model.config.vocab_size != spec.vocab_size:
            raise EngineUnavailable(
                f"the checkpoint's vocab_size {model.config.vocab_size} is not the package's "
                f"{spec.vocab_size}", field="vocab_size", value=model.config.vocab_size,
                remedy="run the package converted from this checkpoint")
        model = model.to(self.dtype)
        model.eval()
        model.to(self.torch_device)
        # greedy with nothing from the checkpoint's generation config (a repetition penalty
        # there would change the tokens); eos is passed to each generate call (and left out
        # under ignore_eos)
        model.generation_config = transformers.GenerationConfig(do_sample=False)
        pad = model.config.pad_token_id
        self._pad = pad if pad is not None else (spec.eos_id if spec.eos_id is not None else 0)
        return model

    # -- decoding ------------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False) -> DecodeResult:
        """Greedy decoding by transformers' ``generate``; stops after emitting eos (unless
        ``ignore_eos``, for timing only: then exactly ``max_new_tokens``). With ``audit``
        each step's raw logits row (``output_logits``) comes back too. Step times come from
        a streamer that transformers hands each token on the host (``tokens.cpu()``, which
        waits for the device), the first being the prefill and its token."""
        torch = self._torch
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        ledger = self.reset_ledger()
        eos = self.package.spec.eos_id
        stamps: list[float] = []

        class _Clock:  # generate's streamer hook: called with the prompt, then each token
            def put(self, value):
                stamps.append(time.perf_counter())

            def end(self):
                pass

        options: dict[str, Any] = {}
        if eos is not None and not ignore_eos:
            options["eos_token_id"] = eos
        if self.use_static_cache:
            options["cache_implementation"] = "static"
        if not self.torch_compile:
            options["disable_compile"] = True
        device = self.torch_device
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids], dtype=torch.long, device=device),
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                pad_token_id=self._pad,
                streamer=_Clock(), use_cache=True, output_logits=audit,
                return_dict_in_generate=True, **options)
            tokens = [int(t) for t in out.sequences[0, len(ids):].tolist()]
        wall = time.perf_counter() - start
        rows = ([step[0].detach().to("cpu", torch.float64).numpy() for step in out.logits]
                if audit else None)
        steps = [b - a for a, b in zip([start] + stamps[1:], stamps[1:])]
        for n, seconds in enumerate(steps):
            ledger.record_forward("prefill" if n == 0 else "decode",
                                  len(ids) if n == 0 else 1, seconds)
        return DecodeResult(self.name, ids, tokens, ledger, wall, steps, rows)

    def greedy(self, prompt, max_new_tokens: int, audit: bool = False) -> DecodeResult:
        """The former name of :meth:`generate` (kept for callers of ``HfEngine.greedy``)."""
        return self.generate(prompt, max_new_tokens, audit=audit)

    def run_component(self, component: str, feeds: dict[str, Any],
                      phase: str | None = None) -> dict[str, Any]:
        """A from-scratch forward (what the oracle asks for): logits and the final hidden
        state over every fed position. A carried cache is refused: hf keeps its own."""
        torch = self._torch
        inputs, outputs = self._ports
        if component != "target":
            raise InputError(f"hf runs the target component only, not {component!r}",
                             field="component", value=component, remedy="use 'target'")
        ids = np.asarray(feeds[inputs["tokens"]])
        m = ids.shape[1]
        positions = feeds.get(inputs.get("positions", ""), np.arange(m).reshape(1, m))
        carried = [name for name, cell in self.package.spec.state_of("target").items()
                   if cell.update == "append" and np.asarray(feeds[cell.input]).shape[2] > 0]
        if carried or not np.array_equal(np.asarray(positions)[0], np.arange(m)):
            raise InputError("hf recomputes from scratch: positions must start at 0 with no "
                             "carried KV cache", field="feeds", value=carried or "positions",
                             remedy="decode through HfEngine.generate (transformers' generate)")
        with torch.inference_mode():
            out = self.model(torch.from_numpy(ids.astype(np.int64)).to(self.torch_device),
                             use_cache=False, output_hidden_states=True)
        np_dtype = np.float16 if self.dtype == torch.float16 else np.float32
        result = {outputs["logits"]: out.logits.float().cpu().numpy().astype(np_dtype)}
        if "hidden" in outputs:
            result[outputs["hidden"]] = (out.hidden_states[-1].float().cpu().numpy()
                                         .astype(np_dtype))
        return result

    def synchronize(self) -> None:
        """Wait for the work queued on the model's CUDA device (nothing to wait for on the
        CPU)."""
        if self.torch_device.type == "cuda":
            self._torch.cuda.synchronize(self.torch_device)

    def close(self) -> None:
        """Drop the model; on CUDA wait for the device and return torch's cached blocks, so
        the engines that follow in the same process get the memory back."""
        model, self.model = getattr(self, "model", None), None
        if model is not None and self.torch_device.type == "cuda":
            torch = self._torch
            torch.cuda.synchronize(self.torch_device)
            del model
            torch.cuda.empty_cache()


def cuda_availability(torch) -> Availability:
    """Whether this torch can run on a CUDA device, and if not, why."""
    built = getattr(torch.version, "cuda", None)
    if not built:
        return Availability(False, f"torch {torch.__version__} is a CPU-only build (no CUDA "
                                   f"support); {INSTALL_CUDA}")
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # a broken driver: the reason, not an exception
        return Availability(False, f"torch {torch.__version__} (CUDA {built}) cannot query "
                                   f"CUDA: {type(exc).__name__}: {exc}")
    if count < 1:
        return Availability(False, f"torch {torch.__version__} (CUDA {built}) sees no CUDA "
                                   f"device (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides "
                                   f"it)")
    return Availability(True, f"torch {torch.__version__} (CUDA {built}), "
                              f"{torch.cuda.get_device_name(0)}")


class HfCudaEngine(HfEngine):
    """transformers on the GPU as a peer: ``cuda:0``, static cache, float16 for a float16
    package and float32 otherwise (or the constructor's ``dtype``)."""

    name = "hf-cuda"
    residency = "cuda:0"
    description = ("transformers' LLaMA/Qwen2 on cuda:0 (SDPA attention, static cache, "
                   "torch.compile where transformers applies it), greedy through generate")
    device: ClassVar[str] = "cuda:0"
    static_cache: ClassVar[bool] = True
    attention: ClassVar[str] = "sdpa"  # transformers' default, as it is run for speed

    @classmethod
    def availability(cls) -> Availability:
        try:
            import torch
            import transformers
        except ImportError as exc:
            return Availability(False, f"{exc.name} is not installed; {INSTALL_CUDA}")
        found = cuda_availability(torch)
        if not found.ok:
            return found
        return Availability(True, f"transformers {transformers.__version__}, {found.reason}")

    @classmethod
    def default_dtype(cls, package_dtype: str) -> str:
        """float16 for a float16 package; float32 for every other (float32, bfloat16): a
        parity run's choice (its records name it, ``provenance()["dtype"]``)."""
        return "float16" if package_dtype == "float16" else "float32"

    @classmethod
    def for_speed(cls, package) -> "HfCudaEngine":
        """Timed as a peer is run for speed: in the package's own dtype (bfloat16 for a
        bfloat16 package, where parity runs compute float32)."""
        dtype = package.spec.dtype
        return cls(package, dtype=dtype) if dtype in DTYPES else cls(package)
