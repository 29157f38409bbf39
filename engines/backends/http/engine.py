"""The HTTP engine: a server that decodes greedily from token ids, judged like any black box.

One class per server, made from how the user names it (``engines.backends.http.spelling``):
``http:llama-server`` (lockstep starts llama.cpp's server on the package's GGUF),
``http:llama-server=URL``, ``http:openai=URL``, ``http:sglang=URL``, or ``http=URL`` (the
protocol detected from the server's own endpoints). A URL given is used as it is and never
stopped; a server lockstep started is stopped by ``close``.

Every request sends the prompt's ids and reads back ids, at temperature 0 (greedy), without
the server's prompt cache, and asks for the top ``TOP_K`` log-probabilities of every step.
Whole logits rows do not cross an HTTP API, so the engine declares ``logprobs_audit`` (not
``logits_audit``): the runner audits the top-k against the oracle's log-softmax
(``harness.topk_audit``, which says what such an audit cannot see). It declares
``concurrent``: ``generate_concurrent`` sends several prompts at once, for the claim
``concurrency_invariance``. The server's version and model go into ``provenance``.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from engines.backends.checkpoint_source import find_checkpoint, require_gguf_source
from engines.backends.http.client import HttpClient, ServerError
from engines.backends.http.flavours import FLAVOURS, Flavour, Identity, detect
from engines.backends.http.server_build import HOW, find_server, require_server
from engines.backends.http.server_process import ServerProcess
from engines.backends.llama_cpp import gguf_scheme, resolve_threads
from engines.backends.llama_plain_buffers import SERVER_FLAG
from engines.decode_result import DecodeResult
from engines.engine import Availability, BlackBoxEngine
from engines.errors import EngineUnavailable, InputError
from engines.ledger import Ledger
from engines.requests import check_request

TOP_K = 10
TIMEOUT_ENV = "LOCKSTEP_HTTP_TIMEOUT"
STARTUP_ENV = "LOCKSTEP_HTTP_STARTUP_TIMEOUT"
SLOTS_ENV = "LOCKSTEP_HTTP_SLOTS"
DEFAULTS = {TIMEOUT_ENV: 120.0, STARTUP_ENV: 120.0, SLOTS_ENV: 4}


def setting(env: str, kind: type = float) -> Any:
    """A positive number from the environment (``DEFAULTS`` when unset); anything else is
    an ``InputError`` naming the variable."""
    text = os.environ.get(env, "").strip()
    if not text:
        return DEFAULTS[env]
    try:
        value = kind(text)
    except ValueError:
        value = None
    # nan passes "<= 0"; a count past int32 (the server's slots) is no count it can hold
    if value is None or not math.isfinite(value) or value <= 0 or \
            (kind is int and value > 2**31 - 1):
        raise InputError(f"{env} must be a positive {kind.__name__}", field=env, value=text,
                         remedy=f"set {env} to a number such as {DEFAULTS[env]}, or unset it")
    return value


def check_settings(starts_server: bool) -> None:
    """The settings an engine of this spelling will read, checked when it is named (before
    any cell, any request): the request timeout, and for a server lockstep starts its
    start-up timeout, slots, threads (the llama-cpp engine's ``LOCKSTEP_LLAMA_THREADS``) and
    the binary a user names (``LOCKSTEP_LLAMA_SERVER``)."""
    setting(TIMEOUT_ENV)
    if starts_server:
        setting(STARTUP_ENV)
        setting(SLOTS_ENV, int)
        resolve_threads(None)
        find_server()


class HttpEngine(BlackBoxEngine):
    """A server that speaks one of ``FLAVOURS`` (the base of every spelling's class)."""

    name = "http"
    description = "a server over HTTP (llama-server, vLLM, SGLang): token ids in, token ids out"
    residency = "host"
    logits_audit = False  # no whole rows over HTTP
    logprobs_audit = True  # the top TOP_K log-probabilities of every step
    concurrent = True
    #: the protocol (a FLAVOURS key); None: detected from the server's endpoints
    flavour_name: ClassVar[str | None] = None
    #: the server's URL; None: lockstep starts llama-server on the package's GGUF
    url: ClassVar[str | None] = None
    #: how the user named it (``--engines``)
    spelling: ClassVar[str] = "http"

    @classmethod
    def availability(cls) -> Availability:
        if cls.url is not None:
            return Availability(True, f"{cls.flavour_name or 'a'} server at {cls.url} "
                                      f"(reached when a run starts)")

        try:
            check_settings(starts_server=True)  # a bad variable is why it cannot run here
            build = find_server()
        except InputError as err:
            return Availability(False, str(err))
        if build is None:
            return Availability(False, f"llama-server is not built here; {HOW}")
        return Availability(True, f"llama-server {build.record.get('version', '')} "
                                  f"({build.binary}); lockstep starts it per package")

    def __init__(self, package):
        super().__init__(package)
        self.timeout = setting(TIMEOUT_ENV)
        self.server = None
        self.build = self.source = self.scheme = None
        self.log_file: str | None = None
        try:
            url = self.url if self.url is not None else self._start()
            self.base_url = url
            self.client = HttpClient(url, self.timeout)
            if self.server is not None:
                self.client.alive_check = self.server.check_alive
            self.flavour: Flavour = (FLAVOURS[self.flavour_name]() if self.flavour_name
                                     else detect(self.client))
            self.identity: Identity = self.flavour.identity(self.client)
        except BaseException:
            self.close()
            raise
        vocab = self.identity.vocab_size
        if vocab is not None and vocab != package.spec.vocab_size:
            self.close()
            raise ServerError(f"the server's model has a vocabulary of {vocab}, the package "
                              f"{package.spec.name!r} has {package.spec.vocab_size}: it serves "
                              f"another model", reason="model", endpoint=self.base_url,
                              remedy="point lockstep at a server of the package's checkpoint")

    # -- a server lockstep starts ---------------------------------------------------------
    def _start(self) -> str:
        """llama-server on the package's GGUF (found and hash-checked like the ``llama-cpp``
        engine's), on 127.0.0.1 and a free port, ready within its start-up time."""
        spec = self.package.spec
        require_gguf_source(self.package, self.name, "starts llama-server on a GGUF file",
                            "run a package converted from a GGUF, or start your own server "
                            "and give its URL (http:openai=URL)")
        self.source = find_checkpoint(self.package.root, self.name)
        self.build = require_server()
        self.scheme = gguf_scheme(self.source.path)
        threads = str(resolve_threads(None))  # the llama-cpp engine's: LOCKSTEP_LLAMA_THREADS
        slots = setting(SLOTS_ENV, int)
        argv = [str(self.build.binary), "-m", str(self.source.path), "--host", "127.0.0.1",
                "--port", "{port}", "-c", str(spec.max_context * slots), "-np", str(slots),
                "-t", threads, "-tb", threads, "-b", "512", "-ub", "512", "-fa", "off",
                "--cache-ram", "0", "--no-webui", SERVER_FLAG]  # no AMX, no repacking
        self.server = ServerProcess("llama-server", argv)
        self.server.start(setting(STARTUP_ENV))
        return self.server.url

    # -- decoding --------------------------------------------------------------------------
    def _complete(self, ids: list[int], max_new_tokens: int, audit: bool,
                  ignore_eos: bool, ledger: Ledger | None = None) -> DecodeResult:
        body = self.flavour.request(ids, max_new_tokens, TOP_K, ignore_eos, self.identity.model)
        start = time.perf_counter()
        try:
            reply = self.client.post_json(self.flavour.path, body)
        except ServerError as err:
            gone = (self.server.exited(within=2.0) if self.server is not None
                    and err.reason in ("lost", "unreachable") else None)
            if gone is None:
                raise
            raise ServerError(f"{err.what}, and {gone.what}", reason="exited",
                              endpoint=err.endpoint, words=gone.words,
                              remedy=gone.remedy) from err
        wall = time.perf_counter() - start
        done = self.flavour.parse(reply)
        # the server's forwards are not seen from here: the ledger stays empty
        return DecodeResult(self.name, ids, done.tokens, ledger or Ledger(), wall, [],
                            top_logprobs=done.steps if audit else None)

    def generate(self, prompt, max_new_tokens: int, audit: bool = False,
                 ignore_eos: bool = False) -> DecodeResult:
        ids = check_request(self.package.spec, prompt, max_new_tokens)
        return self._complete(ids, max_new_tokens, audit, ignore_eos, self.reset_ledger())

    def generate_concurrent(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                            audit: bool = False) -> list[DecodeResult]:
        """Every prompt sent at once, each on its own connection; the first failure is
        raised once all have finished."""
        checked = [check_request(self.package.spec, p, max_new_tokens) for p in prompts]
        with ThreadPoolExecutor(max_workers=len(checked),
                                thread_name_prefix="lockstep-http") as pool:
            futures = [pool.submit(self._complete, ids, max_new_tokens, audit, False)
                       for ids in checked]
            return [f.result() for f in futures]

    # -- records ---------------------------------------------------------------------------
    def attach_evidence(self, folder: Path) -> None:
        """The started server's log moves to ``folder/logs/`` (named in ``provenance``)."""
        if self.server is None:
            return
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        name = f"{self.name}__{self.package.spec.name}__{stamp}-{os.getpid()}.log"
        path = self.server.move_log(Path(folder) / "logs" / name)
        self.log_file = str(path.relative_to(folder))

    def numeric_scheme(self) -> str | None:
        """A server lockstep started runs the GGUF on ggml's CPU kernels, as the
        ``llama-cpp`` engine does: ``ggml-cpu:<type>`` (judged by that scheme's band). A
        server given by URL runs where lockstep cannot see (a GPU, another build): None, the
        package dtype's row."""
        return (self.scheme or {}).get("numeric_scheme")

    def provenance(self) -> dict[str, Any]:
        """The server (protocol, URL, who started it, its version and model as it reports
        them), the request every prompt is sent with, and for a server lockstep started the
        binary's build, the GGUF, the command line and the log."""
        sample = self.flavour.request([0], 1, TOP_K, False, self.identity.model)
        request = {k: ("<the prompt's ids>" if k in ("prompt", "input_ids") else v)
                   for k, v in sample.items() if k not in ("n_predict", "max_tokens")}
        out: dict[str, Any] = {
            "runtime": f"a server over HTTP ({self.flavour.name}: "
                       f"{self.flavour.endpoint})",
            "url": self.base_url, "spelling": self.spelling,
            "started_by": "lockstep" if self.url is None else "the user",
            "server": self.identity.to_dict(), "request": request, "top_k": TOP_K,
            "audit": f"top-{TOP_K} log-probabilities per step (a top-k audit: the record's "
                     f"logits_audit says what it cannot see)"}
        if self.server is not None:
            out.update({"build": self.build.to_dict(), "checkpoint": self.source.to_dict(),
                        **self.scheme,
                        "argv": self.server.argv,
                        "log": self.log_file or str(self.server.log_path)})
        return out

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
            self.server_exit_code = server.exit_code


__all__ = ["DEFAULTS", "HttpEngine", "TOP_K", "check_settings", "setting"]
