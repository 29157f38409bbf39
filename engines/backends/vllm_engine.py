"""``vllm``: vLLM in process on ``cuda:0``, a black box judged by its top-k log-probabilities.

vLLM loads Hugging Face folders, so the package's source checkpoint (found and hash-checked by
``checkpoint_source``, as ``hf`` and ``llama-cpp`` find theirs) becomes one: a GGUF through
transformers' GGUF loader (``hf_model.model_from_gguf``, the very model ``hf`` runs) saved in
float32 with its tokenizer, cached under the cache root by content hash and transformers'
version (:func:`hf_folder`); vLLM casts it to the package's dtype as it loads
(``LLM(dtype=...)``). A Hugging Face source checkpoint is used as it is.

Each decode hands vLLM the prompt's ids (``TokensPrompt``, nothing tokenized) with greedy
sampling parameters (temperature 0, seed 0, the package's eos as the stop id unless
``ignore_eos``) and asks for the top ``TOP_K`` log-probabilities of every generated step, the
same as the HTTP engine asks a server for, so the same top-k audit
(``harness.topk_audit``) judges both; whole logits rows never leave vLLM. The prompt's own
log-probabilities (``prompt_logprobs``) are recorded beside the run's evidence
(:meth:`VllmEngine.attach_evidence`): the audit does not judge them. Several prompts at once
(``generate_concurrent``) go to vLLM in one ``generate`` call, which batches them.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): lockstep's CLI
may have touched CUDA already, and vLLM would then spawn its engine core by re-running the
CLI's main module. ``VLLM_BATCH_INVARIANT`` is read by vLLM from the environment, and
recorded in the provenance with vLLM's version and its attention backend.
"""
from __future__ import annotations

import gc
import importlib.metadata
import json
import math
import os
import shutil
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engines.backends.checkpoint_source import (SIDECAR, CheckpointSource, content_hash,
                                                find_checkpoint, read_source)
from engines.backends.hf import DTYPES, cuda_availability
from engines.backends.hf_model import model_from_gguf
from engines.backends.http.engine import TOP_K
from engines.backends.transformers_quiet import quiet_transformers
from engines.cache_root import cache_root
from engines.decode_result import DecodeResult, StepLogprobs
from engines.engine import Availability, BlackBoxEngine
from engines.errors import EngineUnavailable, ExecutionError, InputError, LockstepError
from engines.ledger import Ledger
from engines.requests import check_request
from engines.shipped_checkpoint import INSTALL as SMOLLM2_INSTALL, smollm2_path

VERSION = "0.26.0"
INSTALL = (f"vLLM {VERSION} runs on a CUDA machine with torch 2.11: "
           f"scripts/fetch_gpu_wheels.sh --with-vllm brings its wheels, scripts/gpu_vllm.sh "
           f"installs them there (docs/GPU.md)")
MEMORY_ENV = "LOCKSTEP_VLLM_GPU_MEMORY"
EAGER_ENV = "LOCKSTEP_VLLM_EAGER"
PROMPT_ENV = "LOCKSTEP_VLLM_PROMPT_LOGPROBS"
DEFAULT_MEMORY = 0.3
# transformers' and vLLM's worker threads, the engine core in this process (see above)
_VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


def memory_fraction() -> float:
    """``$LOCKSTEP_VLLM_GPU_MEMORY``: the share of the GPU vLLM may take (default 0.3)."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return DEFAULT_MEMORY
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value <= 1:
        raise InputError(f"{MEMORY_ENV} must be a fraction in (0, 1]", field=MEMORY_ENV,
                         value=text, remedy=f"set it to a fraction such as {DEFAULT_MEMORY}, "
                                            f"or unset it")
    return value


def flag(env: str, default: bool) -> bool:
    """A 0/1 switch from the environment (``default`` when unset)."""
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    if text not in ("0", "1"):
        raise InputError(f"{env} must be 0 or 1", field=env, value=text,
                         remedy=f"set {env}=1 or {env}=0, or unset it")
    return text == "1"


# -- vLLM's outputs, as lockstep's ----------------------------------------------------------

def _sorted_top(position: Mapping[int, Any]) -> tuple[tuple[int, float], ...]:
    """One position's ``{id: Logprob}`` as ``(id, logprob)`` pairs, best first (NaN last)."""
    pairs = [(int(i), float(p.logprob)) for i, p in position.items()]
    return tuple(sorted(pairs, key=lambda p: math.inf if math.isnan(p[1]) else -p[1]))


def step_logprobs(token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None,
                  ) -> list[StepLogprobs]:
    """vLLM's sample log-probabilities (``CompletionOutput.logprobs``: one ``{id: Logprob}``
    per generated token, the top k and the sampled token) as the HTTP engine's
    ``StepLogprobs``. A position that lacks its own token, or a count that differs from the
    tokens', is vLLM's output broken: an ``ExecutionError``."""
    if logprobs is None or len(logprobs) != len(token_ids):
        raise ExecutionError(
            f"vLLM returned {len(token_ids)} tokens but "
            f"{'no' if logprobs is None else len(logprobs)} log-probability positions",
            field="logprobs", value=None if logprobs is None else len(logprobs),
            remedy="ask for logprobs in SamplingParams (the engine does); report it to vLLM")
    steps = []
    for n, (token, position) in enumerate(zip(token_ids, logprobs)):
        chosen = position.get(int(token)) if position is not None else None
        if chosen is None:
            raise ExecutionError(f"vLLM's log-probabilities at step {n} lack the token it "
                                 f"emitted ({int(token)})", field="logprobs", value=n,
                                 remedy="report it to vLLM")
        steps.append(StepLogprobs(int(token), float(chosen.logprob), _sorted_top(position)))
    return steps


def prompt_record(prompt: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None
                  ) -> list[dict[str, Any] | None]:
    """vLLM's ``RequestOutput.prompt_logprobs`` (None for the first position, which has no
    context) as JSON: each later position's own token, its log-probability and the top k."""
    if logprobs is None:
        return []
    out: list[dict[str, Any] | None] = []
    for token, position in zip(prompt, logprobs):
        if position is None:
            out.append(None)
            continue
        own = position.get(int(token))
        out.append({"token": int(token),
                    "logprob": None if own is None else float(own.logprob),
                    "top": [list(p) for p in _sorted_top(position)]})
    return out


def to_result(engine: str, prompt: list[int], output: Any, ledger: Ledger, wall_s: float,
              audit: bool) -> DecodeResult:
    """One ``RequestOutput`` (its first ``CompletionOutput``) as a ``DecodeResult``: the
    generated ids and, with ``audit``, each step's top-k. vLLM's steps are not seen one by
    one from here: the ledger stays empty, as a server's."""
    if not output.outputs:
        raise ExecutionError("vLLM returned no completion for the prompt", field="outputs",
                             value=0, remedy="report it to vLLM")
    completion = output.outputs[0]
    tokens = [int(t) for t in completion.token_ids]
    top = step_logprobs(tokens, completion.logprobs) if audit else None
    return DecodeResult(engine, prompt, tokens, ledger, wall_s, [], top_logprobs=top)


# -- the model folder vLLM loads ------------------------------------------------------------

def align_eos(tokenizer, eos: Any) -> None:
    """Make ``eos`` (the configuration's, which transformers reads from the GGUF's
    ``tokenizer.ggml.eos_token_id``) the tokenizer's eos: vLLM stops at the tokenizer's, and
    transformers 5.17's GGUF tokenizer names SmolLM2's <|im_start|> (1) for its <|im_end|> (2)."""
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)


def hf_folder(source) -> Path:
    """The Hugging Face folder of ``source`` (a ``CheckpointSource``): the source itself
    when it is one, else transformers' model of the GGUF and its tokenizer saved in float32,
    under ``<cache root>/vllm-hf/`` keyed by the checkpoint's content hash and transformers'
    version, renamed into place whole."""
    if source.kind != "gguf":
        return Path(source.path)
    import transformers

    folder = (cache_root() / "vllm-hf" /
              f"{source.content_hash.partition(':')[2][:16]}-transformers-"
              f"{transformers.__version__}")
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    path = Path(source.path)
    with quiet_transformers():
        model = model_from_gguf(path, source.content_hash, "eager")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent),
                                                               gguf_file=path.name)
    align_eos(tokenizer, model.config.eos_token_id)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with quiet_transformers():
            model.save_pretrained(str(staged))
        tokenizer.save_pretrained(str(staged))
        if folder.exists():
            shutil.rmtree(staged)  # published meanwhile by another process
        else:
            staged.rename(folder)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return folder


def _attention_backends(worker) -> list[str]:
    """Run inside vLLM's worker (``LLM.collective_rpc``): its attention backends' names."""
    groups = worker.model_runner.attn_groups
    return sorted({g.backend.get_name() for per_cache in groups for g in per_cache})


class VllmEngine(BlackBoxEngine):
    name = "vllm"
    description = ("vLLM in process on cuda:0 (token-id prompts, greedy), on a Hugging Face "
                   "folder of the package's source checkpoint; top-k log-probabilities audited")
    residency = "cuda:0"
    logits_audit = False  # no whole rows leave vLLM
    logprobs_audit = True  # the top TOP_K log-probabilities of every step
    concurrent = True  # several prompts in one generate call, batched by vLLM

    @classmethod
    def availability(cls) -> Availability:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return Availability(False, f"vllm is not installed; {INSTALL}")
        try:
            import torch
        except ImportError as exc:
            return Availability(False, f"{exc.name} is not installed; {INSTALL}")
        found = cuda_availability(torch)
        if not found.ok:
            return Availability(False, f"vllm {version} needs CUDA: {found.reason}")
        return Availability(True, f"vllm {version}, {found.reason}")

    @classmethod
    def supports(cls, package) -> Availability:
        """Packages converted from a checkpoint (``checkpoint.json`` names it by content
        hash) in a dtype vLLM computes in."""
        source = read_source(package.root) or {}
        if not source.get("content_hash"):
            return Availability(False, f"{cls.name} builds its model from the package's source "
                                       f"checkpoint; this package has no {SIDECAR} naming one "
                                       f"(a fixture built from a seed)")
        if package.spec.dtype not in DTYPES:
            return Availability(False, f"{cls.name} computes in {', '.join(DTYPES)}, not the "
                                       f"package's {package.spec.dtype}")
        return Availability(True)

    def __init__(self, package, *, enforce_eager: bool | None = None,
                 gpu_memory_utilization: float | None = None,
                 prompt_logprobs: bool | None = None, checkpoint=None):
        """``enforce_eager``: no CUDA graphs nor torch.compile (default
        ``$LOCKSTEP_VLLM_EAGER``, else on: a start within seconds). ``gpu_memory_utilization``:
        vLLM's share of the GPU (default ``$LOCKSTEP_VLLM_GPU_MEMORY``, else 0.3).
        ``prompt_logprobs``: record the prompt's top-k too (default
        ``$LOCKSTEP_VLLM_PROMPT_LOGPROBS``, else on). ``checkpoint``: a ``CheckpointSource``
        (default: the one ``checkpoint.json`` names)."""
        super().__init__(package)
        found = self.availability()
        if not found.ok:
            raise EngineUnavailable(found.reason, field="engine", value=self.name,
                                    remedy=INSTALL)
        named = self.supports(package)
        if not named.ok:
            raise EngineUnavailable(named.reason, field="package", value=str(package.root),
                                    remedy="run a package made by lockstep convert, in float32, "
                                           "float16 or bfloat16")
        self.enforce_eager = flag(EAGER_ENV, True) if enforce_eager is None else enforce_eager
        self.memory = memory_fraction() if gpu_memory_utilization is None \
            else float(gpu_memory_utilization)
        self.with_prompt = flag(PROMPT_ENV, True) if prompt_logprobs is None \
            else prompt_logprobs
        self.prompt_file: Path | None = None
        self._evidence: Path | None = None
        self.source = checkpoint or find_checkpoint(package.root, self.name)
        self.folder = hf_folder(self.source)
        for key, value in _VLLM_ENV.items():
            os.environ.setdefault(key, value)
        from vllm import LLM

        self.llm = LLM(**self.options())
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        if vocab != package.spec.vocab_size:
            self.close()
            raise ExecutionError(
                f"vLLM reads a vocabulary of {vocab} from {self.folder}, the package has "
                f"{package.spec.vocab_size}: they were not made from one checkpoint",
                field="vocab_size", value=vocab, remedy="run the package converted from it")
        self.backends = self._backends()

    def options(self) -> dict[str, Any]:
        """``vllm.LLM``'s arguments: the folder, the package's dtype and context, seed 0, no
        prefix cache (each prompt computed from scratch, as a server is asked to)."""
        return {"model": str(self.folder), "tokenizer": str(self.folder),
                "dtype": self.package.spec.dtype, "seed": 0,
                "max_model_len": self.package.spec.max_context,
                "enforce_eager": self.enforce_eager, "gpu_memory_utilization": self.memory,
                "enable_prefix_caching": False, "max_logprobs": TOP_K,
                "disable_log_stats": True}

    def _backends(self) -> list[str] | str:
        try:
            return self.llm.collective_rpc(_attention_backends)[0]
        except Exception as exc:  # the worker's layout is vLLM's own: say what was missed
            return f"not read ({type(exc).__name__}: {exc})"

    def _params(self, max_new_tokens: int, ignore_eos: bool, audit: bool):
        from vllm import SamplingParams

        eos = self.package.spec.eos_id
        return SamplingParams(
            temperature=0.0, seed=0, max_tokens=int(max_new_tokens), ignore_eos=ignore_eos,
            stop_token_ids=[] if ignore_eos or eos is None else [int(eos)],
            logprobs=TOP_K if audit else None,
            prompt_logprobs=TOP_K if self.with_prompt and audit else None, detokenize=False)

    def _run(self, prompts: list[list[int]], max_new_tokens: int, audit: bool,
             ignore_eos: bool) -> tuple[list[Any], float]:
        from vllm.inputs import TokensPrompt

        params = self._params(max_new_tokens, ignore_eos, audit)
        start = time.perf_counter()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                                    params, use_tqdm=False)
        wall = time.perf_counter() - start
        if self.prompt_file is not None and params.prompt_logprobs:
            with open(self.prompt_file, "a", encoding="utf-8") as f:
                for ids, out in zip(prompts, outputs):
                    f.write(json.dumps({"prompt": ids, "prompt_logprobs":
                                        prompt_record(ids, out.prompt_logprobs)}) + "\n")
        return outputs, wall

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False) -> DecodeResult:
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        ledger = self.reset_ledger()
        outputs, wall = self._run([ids], max_new_tokens, audit, ignore_eos)
        return to_result(self.name, ids, outputs[0], ledger, wall, audit)

    def generate_concurrent(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                            audit: bool = False) -> list[DecodeResult]:
        """Every prompt in one ``generate`` call: vLLM schedules them as one batch."""
        checked = [check_request(self.package.spec, p, max_new_tokens) for p in prompts]
        outputs, wall = self._run(checked, max_new_tokens, audit, False)
        return [to_result(self.name, ids, out, Ledger(), wall, audit)
                for ids, out in zip(checked, outputs)]

    def attach_evidence(self, folder: Path) -> None:
        """The prompts' log-probabilities go to ``folder/logs/`` (named in ``provenance``)."""
        if not self.with_prompt:
            return
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        logs = Path(folder) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.prompt_file = logs / (f"{self.name}__{self.package.spec.name}__prompt-logprobs-"
                                   f"{stamp}-{os.getpid()}.jsonl")
        self._evidence = Path(folder)

    def provenance(self) -> dict[str, Any]:
        """vLLM's version, its attention backend, VLLM_BATCH_INVARIANT, the settings and
        sampling parameters, the folder it loaded and the checkpoint it was made from."""
        import torch
        import vllm

        params = self._params(1, False, True)
        prompt = (str(self.prompt_file.relative_to(self._evidence))
                  if self.prompt_file is not None else None)
        return {"runtime": "vLLM in process (LLM.generate on token-id prompts)",
                "vllm": vllm.__version__, "torch": torch.__version__,
                "attention_backends": self.backends,
                "VLLM_BATCH_INVARIANT": os.environ.get("VLLM_BATCH_INVARIANT", "unset"),
                "options": self.options(),
                "sampling": {"temperature": params.temperature, "seed": params.seed,
                             "stop_token_ids": params.stop_token_ids,
                             "logprobs": params.logprobs,
                             "prompt_logprobs": params.prompt_logprobs},
                "model_folder": str(self.folder),
                "conversion": ("transformers' GGUF loader, saved as a float32 Hugging Face "
                               "folder; vLLM casts it to the dtype"
                               if self.source.kind == "gguf" else "the checkpoint's own folder"),
                "checkpoint": self.source.to_dict(), "top_k": TOP_K,
                "audit": f"top-{TOP_K} log-probabilities per step (a top-k audit)",
                "prompt_logprobs_file": prompt}

    def close(self) -> None:
        """Shut vLLM's engine core down and give its memory back, so a second package's
        engine fits in the same process."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort: the process is what frees it all
            pass
        del llm
        try:
            from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                                         destroy_model_parallel)

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:  # noqa: BLE001
            pass
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    """``python -m engines.backends.vllm_engine smollm2``: build (or reuse) the folder vLLM
    loads for the shipped GGUF and print it; ``make real`` runs it with the other shared
    conversions, so the suite and a GPU run find it (and transformers' GGUF load) cached."""
    if argv is None:
        argv = sys.argv[1:]
    if argv != ["smollm2"]:
        print("usage: python -m engines.backends.vllm_engine smollm2", file=sys.stderr)
        return 2
    path = smollm2_path()
    if path is None:
        print(f"error: SmolLM2 is not installed: {SMOLLM2_INSTALL}", file=sys.stderr)
        return 2
    try:
        print(hf_folder(CheckpointSource(path, "gguf", content_hash(path))))
    except (LockstepError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["VllmEngine", "align_eos", "hf_folder", "prompt_record", "step_logprobs", "to_result"]
