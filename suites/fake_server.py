"""A fake inference server for the suite: llama-server's protocol (``/completion``,
``/props``, ``/v1/models``, ``/health``), the OpenAI-compatible ``/v1/completions`` (as vLLM
answers it) and SGLang's ``/generate``, computed by a real lockstep host engine on a fixture
(``native-host`` on tiny_llama), so the happy path must be judged ``identical``; with a switch
for each fault a real server shows.

    fault      what the server does on the ``fault_on``-th completion request
    http500    HTTP 500 with an error body
    loading    HTTP 503 "Loading model" to the first ``fault_on`` requests, then it serves
    timeout    sleeps ``sleep`` seconds before answering
    malformed  a body that is not JSON
    strings    token strings where ids were asked for
    drop       closes the connection without a reply (a server killed mid-request)
    die        the whole process exits (in its own process only: ``python -m
               suites.fake_server``, standing in for a llama-server binary)

``batch_window``: each request waits this long after arriving before it is computed, and is
computed knowing how many requests were in flight then (as a batching server would), which
the planted engines of ``suites.planted.servers`` use.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

PROTOCOLS = ("llama-server", "openai", "sglang")


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = np.asarray(row, dtype=np.float64)
    top = row.max()
    return row - (top + math.log(float(np.exp(row - top).sum())))


POLL_INTERVAL = 0.02  # seconds between the serving loop's looks at a shutdown


class FakeServer:
    def __init__(self, package, engine_cls=None, *, protocols=PROTOCOLS, fault=None,
                 fault_on: int = 1, sleep: float = 5.0, batch_window: float = 0.0,
                 port: int = 0):
        from suites.planted.servers import ServedEngine

        self.package = package
        self.engine = (engine_cls or ServedEngine)(package)
        self.protocols, self.fault, self.fault_on = set(protocols), fault, fault_on
        self.sleep, self.batch_window = sleep, batch_window
        self.lock = threading.Lock()
        self.count_lock = threading.Lock()
        self.in_flight = 0
        self.completions = 0  # completion requests seen
        self.peak = 0  # the most requests in flight at once
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeServer":
        # ``shutdown`` waits for the serving loop to look at its flag, which it does every
        # poll interval: at the default 0.5 s every test that stops a server waited for it
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={
            "poll_interval": POLL_INTERVAL}, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- computing ---------------------------------------------------------------------------
    def decode(self, ids: list[int], n: int, k: int, in_flight: int):
        """Greedy tokens and per step (logprob of the token, top-k pairs)."""
        from engines.workflow import greedy_decode

        with self.lock:
            self.engine.in_flight = in_flight
            try:
                result = greedy_decode(self.engine, ids, n, audit=True)
            finally:
                self.engine.in_flight = 1
        steps = []
        for token, row in zip(result.tokens, result.logits):
            lsm = log_softmax(row)
            order = np.lexsort((np.arange(lsm.size), -lsm))[:k]
            steps.append((float(lsm[token]), [(int(i), float(lsm[i])) for i in order]))
        return list(result.tokens), steps

    def _fault_now(self) -> str | None:
        """The fault of this completion request: ``loading`` for the first ``fault_on``,
        any other on the ``fault_on``-th alone."""
        if self.fault is None:
            return None
        if self.fault == "loading":
            return "loading" if self.completions <= self.fault_on else None
        return self.fault if self.completions == self.fault_on else None

    # -- HTTP ------------------------------------------------------------------------------
    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def reply(self, status: int, body, raw: bytes | None = None):
                data = raw if raw is not None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                spec = server.package.spec
                if self.path == "/health":
                    return self.reply(200, {"status": "ok"})
                if self.path == "/props" and "llama-server" in server.protocols:
                    return self.reply(200, {"build_info": "b0-fake", "model_path":
                                            f"fake/{spec.name}.gguf", "total_slots": 4,
                                            "default_generation_settings": {"n_ctx": 256}})
                if self.path == "/v1/models" and server.protocols & {"llama-server", "openai"}:
                    return self.reply(200, {"object": "list", "data": [
                        {"id": f"fake-{spec.name}", "object": "model", "owned_by": "lockstep",
                         "max_model_len": spec.max_context,
                         "meta": {"n_vocab": spec.vocab_size}}]})
                if self.path == "/version" and "openai" in server.protocols:
                    return self.reply(200, {"version": "0.0-fake"})
                if self.path == "/get_model_info" and "sglang" in server.protocols:
                    return self.reply(200, {"model_path": f"fake/{spec.name}",
                                            "tokenizer_path": None, "is_generation": True})
                return self.reply(404, {"error": {"code": 404, "message": "File Not Found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                routes = {"/completion": "llama-server", "/v1/completions": "openai",
                          "/generate": "sglang"}
                protocol = routes.get(self.path)
                if protocol not in server.protocols:
                    return self.reply(404, {"error": {"code": 404, "message": "Not Found"}})
                with server.count_lock:
                    server.completions += 1
                    server.in_flight += 1
                    server.peak = max(server.peak, server.in_flight)
                    fault = server._fault_now()
                try:
                    self.complete(protocol, body, fault)
                finally:
                    with server.count_lock:
                        server.in_flight -= 1

            def complete(self, protocol, body, fault):
                if fault == "http500":
                    return self.reply(500, {"error": {"code": 500, "message":
                                                      "fake: the decode failed (CUDA OOM)"}})
                if fault == "loading":
                    return self.reply(503, {"error": {"code": 503, "message": "Loading model",
                                                      "type": "unavailable_error"}})
                if fault == "timeout":
                    time.sleep(server.sleep)
                if fault == "malformed":
                    return self.reply(200, None, raw=b"<html>502 Bad Gateway</html>")
                if fault == "drop":
                    self.close_connection = True
                    return
                if fault == "die":
                    print("fake: dying in the middle of a request", flush=True)
                    os._exit(3)
                if server.batch_window:
                    time.sleep(server.batch_window)
                in_flight = server.in_flight
                if protocol == "llama-server":
                    ids, n, k = body["prompt"], body["n_predict"], body["n_probs"]
                elif protocol == "openai":
                    ids, n, k = body["prompt"], body["max_tokens"], body["logprobs"]
                else:
                    ids = body["input_ids"]
                    n, k = body["sampling_params"]["max_new_tokens"], body["top_logprobs_num"]
                tokens, steps = server.decode(ids, n, k, in_flight)
                if fault == "strings":
                    tokens = [f"piece{t}" for t in tokens]
                return self.reply(200, getattr(self, protocol.replace("-", "_"))(tokens, steps))

            def llama_server(self, tokens, steps):
                return {"content": "", "tokens": tokens, "stop": True, "stop_type": "limit",
                        "completion_probabilities": [
                            {"id": t, "token": "", "logprob": lp, "top_logprobs": [
                                {"id": i, "token": "", "logprob": v} for i, v in top]}
                            for t, (lp, top) in zip(tokens, steps)]}

            def openai(self, tokens, steps):
                name = (lambda t: t if isinstance(t, str) else f"token_id:{t}")
                return {"object": "text_completion", "choices": [{
                    "index": 0, "text": "", "finish_reason": "length",
                    "logprobs": {"tokens": [name(t) for t in tokens],
                                 "token_logprobs": [lp for lp, _ in steps],
                                 "top_logprobs": [{f"token_id:{i}": v for i, v in top}
                                                  for _, top in steps]}}]}

            def sglang(self, tokens, steps):
                return {"text": "", "output_ids": tokens, "meta_info": {
                    "finish_reason": {"type": "length"},
                    "output_token_logprobs": [[lp, t, None] for t, (lp, _) in zip(tokens, steps)],
                    "output_top_logprobs": [[[v, i, None] for i, v in top]
                                            for _, top in steps]}}

        return Handler


def main(argv: list[str] | None = None) -> int:
    """Stands in for a llama-server binary: takes its --host/--port (ignores the rest) and
    serves ``$FAKE_SERVER_PACKAGE`` with ``$FAKE_SERVER_FAULT`` (``die:N``: exit during the
    N-th completion request)."""
    import argparse

    from harness.packages import resolve_package

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args(argv)
    fault, _, on = os.environ.get("FAKE_SERVER_FAULT", "").partition(":")
    print(f"fake llama-server: loading {os.environ['FAKE_SERVER_PACKAGE']}", flush=True)
    server = FakeServer(resolve_package(os.environ["FAKE_SERVER_PACKAGE"]),
                        protocols=("llama-server",), fault=fault or None,
                        fault_on=int(on or 1), port=args.port)
    print(f"fake llama-server: listening on {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
