"""The protocols lockstep speaks to servers, one class per flavour: how a greedy request
with a token-id prompt is written, how token ids and top-k log-probabilities are read back,
and how the server names itself.

Every flavour sends token ids and reads back token ids, never strings: a reply that carries
only text (a server that ignored the request for ids) is a :class:`ServerError` of its own
(``reason="ids"``), because re-tokenizing text would judge the tokenizer, not the engine.

* ``llama-server`` (llama.cpp's own server) ``POST /completion``: ``prompt`` as ids,
  ``n_predict``, ``temperature`` 0 with the temperature sampler alone (greedy: the highest
  logit, lowest id on ties), ``cache_prompt: false`` (cached and uncached evaluation are
  not bit-identical), ``n_probs`` (top-k of the raw distribution, with ids),
  ``return_tokens``, ``ignore_eos``.
* ``openai`` (vLLM's and SGLang's OpenAI-compatible ``POST /v1/completions``): ``prompt`` as
  a list of ids, ``temperature: 0`` always (an omitted temperature falls back to the model's
  generation config), ``logprobs: k``, ``return_tokens_as_token_ids`` (tokens come back as
  ``token_id:N``), ``return_token_ids``, ``ignore_eos``.
* ``sglang`` (SGLang's native ``POST /generate``): ``input_ids``, ``return_logprob``,
  ``top_logprobs_num``; ids from ``output_ids`` or the ``[logprob, id, text]`` triples.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engines.decode_result import StepLogprobs
from engines.backends.http.client import HttpClient, ServerError, trimmed


@dataclass
class Completion:
    """One request's answer: the generated ids and, per step, the top-k log-probabilities."""
    tokens: list[int]
    steps: list[StepLogprobs]


@dataclass
class Identity:
    """What a server says about itself, for the record's engine provenance."""
    flavour: str
    model: str | None = None
    version: str | None = None
    vocab_size: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"flavour": self.flavour, "model": self.model, "version": self.version,
                "vocab_size": self.vocab_size, **self.details}


def _number(value: Any, what: str, endpoint: str, null_is_nan: bool = False) -> float:
    """A log-probability as sent (a NaN or an infinity is kept: the audit reports it); a
    value that is no number is a malformed reply. ``null_is_nan``: the server writes a
    non-finite float as ``null`` (llama-server's JSON library does)."""
    if value is None and null_is_nan:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str) and value.strip().lower() in ("nan", "-inf", "inf",
                                                                "-infinity", "infinity"):
            return float(value.replace("inity", ""))
        raise ServerError(f"{what} is {trimmed(repr(value), 60)}, not a number",
                          reason="malformed", endpoint=endpoint)
    return float(value)


def _token_id(value: Any, what: str, endpoint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServerError(f"{what} is {trimmed(repr(value), 60)}, not a token id: the server "
                          f"sent strings where ids were asked for", reason="ids",
                          endpoint=endpoint,
                          remedy="use a server version that returns token ids (llama-server "
                                 "return_tokens, vLLM return_tokens_as_token_ids)")
    return value


def _get(body: Any, key: str, endpoint: str, kind: type | tuple = (list, dict)) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise ServerError(f"the reply has no {key!r}", reason="malformed", endpoint=endpoint,
                          words=trimmed(repr(body)))
    value = body[key]
    if not isinstance(value, kind):
        raise ServerError(f"{key!r} in the reply is a {type(value).__name__}",
                          reason="malformed", endpoint=endpoint, words=trimmed(repr(value)))
    return value


class Flavour:
    """One server protocol: ``request`` writes a greedy request for a prompt's ids (``k``: how
    many top log-probabilities each step asks for), ``parse`` reads the ids and
    log-probabilities back from the reply to ``path``, ``identity`` asks the server what it
    is."""

    name: ClassVar[str]
    path: ClassVar[str]

    def request(self, prompt: Sequence[int], max_new_tokens: int, k: int,
                ignore_eos: bool, model: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, body: Any) -> Completion:
        raise NotImplementedError

    def identity(self, client: HttpClient) -> Identity:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        return f"POST {self.path}"

    def _steps(self, tokens: list[int], chosen: list[float], tops: list[list[tuple]]
               ) -> list[StepLogprobs]:
        if not len(tokens) == len(chosen) == len(tops):
            raise ServerError(f"{len(tokens)} tokens but {len(chosen)} log-probabilities and "
                              f"{len(tops)} top-k lists", reason="malformed",
                              endpoint=self.endpoint)
        return [StepLogprobs(t, lp, tuple(sorted(top, key=lambda p: -_key(p[1]))))
                for t, lp, top in zip(tokens, chosen, tops)]


def _key(value: float) -> float:
    return -math.inf if math.isnan(value) else value


class LlamaServer(Flavour):
    """llama.cpp's ``llama-server`` (``/completion``, ``/props``, ``/v1/models``)."""

    name = "llama-server"
    path = "/completion"

    def request(self, prompt, max_new_tokens, k, ignore_eos, model):
        return {"prompt": [int(t) for t in prompt], "n_predict": int(max_new_tokens),
                "temperature": 0.0, "samplers": ["temperature"], "cache_prompt": False,
                "n_probs": int(k), "post_sampling_probs": False, "return_tokens": True,
                "ignore_eos": bool(ignore_eos), "stream": False, "seed": 0}

    def parse(self, body):
        ep = self.endpoint
        raw = _get(body, "tokens", ep, list)
        tokens = [_token_id(t, f"tokens[{i}]", ep) for i, t in enumerate(raw)]
        probs = _get(body, "completion_probabilities", ep, list) if tokens else []
        chosen, tops = [], []
        for i, step in enumerate(probs):
            _token_id(_get(step, "id", ep, (int,)), f"completion_probabilities[{i}].id", ep)
            chosen.append(_number(step.get("logprob"), f"step {i}'s logprob", ep, True))
            top = _get(step, "top_logprobs", ep, list)
            tops.append([(_token_id(_get(p, "id", ep, (int,)), f"step {i}'s top id", ep),
                          _number(p.get("logprob"), f"step {i}'s top logprob", ep, True))
                         for p in top])
        ids = [s["id"] for s in probs]
        if ids != tokens:
            raise ServerError(f"the ids in completion_probabilities {trimmed(str(ids), 80)} are "
                              f"not the returned tokens {trimmed(str(tokens), 80)}",
                              reason="malformed", endpoint=ep)
        return Completion(tokens, self._steps(tokens, chosen, tops))

    def identity(self, client):
        props = client.get_json("/props")
        models = client.get_json("/v1/models")
        meta = {}
        if isinstance(models, dict) and models.get("data"):
            meta = models["data"][0].get("meta") or {}
        settings = props.get("default_generation_settings") or {}
        return Identity(self.name, model=props.get("model_path") or props.get("model_alias"),
                        version=props.get("build_info"), vocab_size=meta.get("n_vocab"),
                        details={"total_slots": props.get("total_slots"),
                                 "n_ctx_per_slot": settings.get("n_ctx"),
                                 "model_ftype": props.get("model_ftype"),
                                 "model_meta": meta})


class OpenAICompletions(Flavour):
    """The OpenAI-compatible ``/v1/completions`` of vLLM and SGLang (``/v1/models``, and
    ``/version`` where the server has one)."""

    name = "openai"
    path = "/v1/completions"

    def request(self, prompt, max_new_tokens, k, ignore_eos, model):
        return {"model": model, "prompt": [int(t) for t in prompt],
                "max_tokens": int(max_new_tokens), "temperature": 0.0, "n": 1, "seed": 0,
                "logprobs": int(k), "return_tokens_as_token_ids": True,
                "return_token_ids": True, "ignore_eos": bool(ignore_eos), "stream": False,
                "echo": False}

    @staticmethod
    def _id(text: Any, what: str, endpoint: str) -> int:
        if isinstance(text, str) and text.startswith("token_id:"):
            try:
                return int(text[len("token_id:"):])
            except ValueError:
                pass
        raise ServerError(f"{what} is {trimmed(repr(text), 60)}, not 'token_id:N': the server "
                          f"sent strings where ids were asked for", reason="ids",
                          endpoint=endpoint,
                          remedy="use vLLM (it honours return_tokens_as_token_ids), or the "
                                 "sglang flavour (/generate) for SGLang")

    def parse(self, body):
        ep = self.endpoint
        choices = _get(body, "choices", ep, list)
        if len(choices) != 1:
            raise ServerError(f"{len(choices)} choices, not 1", reason="malformed", endpoint=ep)
        choice = choices[0]
        logprobs = _get(choice, "logprobs", ep, dict)
        texts = _get(logprobs, "tokens", ep, list)
        tokens = [self._id(t, f"logprobs.tokens[{i}]", ep) for i, t in enumerate(texts)]
        if isinstance(choice.get("token_ids"), list):
            given = [_token_id(t, f"token_ids[{i}]", ep)
                     for i, t in enumerate(choice["token_ids"])]
            if given != tokens:
                raise ServerError(f"token_ids {trimmed(str(given), 80)} are not the logprobs' "
                                  f"tokens {trimmed(str(tokens), 80)}", reason="malformed",
                                  endpoint=ep)
        chosen = [_number(v, f"token_logprobs[{i}]", ep)
                  for i, v in enumerate(_get(logprobs, "token_logprobs", ep, list))]
        tops = []
        for i, top in enumerate(_get(logprobs, "top_logprobs", ep, list)):
            if not isinstance(top, dict):
                raise ServerError(f"top_logprobs[{i}] is not an object", reason="malformed",
                                  endpoint=ep, words=trimmed(repr(top)))
            tops.append([(self._id(t, f"top_logprobs[{i}] key", ep),
                          _number(v, f"top_logprobs[{i}][{t!r}]", ep)) for t, v in top.items()])
        return Completion(tokens, self._steps(tokens, chosen, tops))

    def identity(self, client):
        models = client.get_json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not data:
            raise ServerError("/v1/models lists no model", reason="malformed",
                              endpoint="GET /v1/models", words=trimmed(repr(models)))
        first = data[0]
        version = None
        try:
            found = client.get_json("/version", timeout=5)
            version = found.get("version") if isinstance(found, dict) else None
        except ServerError:
            pass  # not every OpenAI-compatible server has /version
        return Identity(self.name, model=first.get("id"), version=version,
                        details={"root": first.get("root"),
                                 "max_model_len": first.get("max_model_len"),
                                 "owned_by": first.get("owned_by")})


class SglangGenerate(Flavour):
    """SGLang's native ``/generate`` (``/get_model_info``, ``/get_server_info``)."""

    name = "sglang"
    path = "/generate"

    def request(self, prompt, max_new_tokens, k, ignore_eos, model):
        return {"input_ids": [int(t) for t in prompt],
                "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": 0.0,
                                    "ignore_eos": bool(ignore_eos)},
                "return_logprob": True, "top_logprobs_num": int(k),
                "logprob_start_len": -1, "stream": False}

    def parse(self, body):
        ep = self.endpoint
        meta = _get(body, "meta_info", ep, dict)
        triples = _get(meta, "output_token_logprobs", ep, list)
        chosen, ids = [], []
        for i, t in enumerate(triples):
            if not isinstance(t, list) or len(t) < 2:
                raise ServerError(f"output_token_logprobs[{i}] is not [logprob, id, ...]",
                                  reason="malformed", endpoint=ep, words=trimmed(repr(t)))
            chosen.append(_number(t[0], f"output_token_logprobs[{i}][0]", ep))
            ids.append(_token_id(t[1], f"output_token_logprobs[{i}][1]", ep))
        tokens = ids
        if isinstance(body.get("output_ids"), list):
            tokens = [_token_id(t, f"output_ids[{i}]", ep)
                      for i, t in enumerate(body["output_ids"])]
            if tokens != ids:
                raise ServerError("output_ids are not the ids of output_token_logprobs",
                                  reason="malformed", endpoint=ep)
        tops = []
        for i, top in enumerate(_get(meta, "output_top_logprobs", ep, list)):
            tops.append([(_token_id(p[1], f"output_top_logprobs[{i}] id", ep),
                          _number(p[0], f"output_top_logprobs[{i}] logprob", ep))
                         for p in top])
        return Completion(tokens, self._steps(tokens, chosen, tops))

    def identity(self, client):
        info = client.get_json("/get_model_info")
        version = None
        try:
            server = client.get_json("/get_server_info", timeout=5)
            version = server.get("version") if isinstance(server, dict) else None
        except ServerError:
            pass
        return Identity(self.name, model=info.get("model_path"), version=version,
                        details={"tokenizer_path": info.get("tokenizer_path")})


FLAVOURS: dict[str, type[Flavour]] = {f.name: f for f in (LlamaServer, OpenAICompletions,
                                                          SglangGenerate)}


def detect(client: HttpClient) -> Flavour:
    """The flavour a server speaks, from its own endpoints: llama-server's ``/props``
    (``build_info``), SGLang's ``/get_model_info``, else an OpenAI-compatible
    ``/v1/models``."""
    probes = (("/props", "build_info", LlamaServer), ("/get_model_info", "model_path",
                                                      SglangGenerate),
              ("/v1/models", "data", OpenAICompletions))
    tried = []
    for path, key, flavour in probes:
        try:
            body = client.get_json(path)
        except ServerError as err:
            if err.reason in ("unreachable", "timeout", "loading"):
                raise
            tried.append(f"{path}: {err.reason}{' ' + str(err.status) if err.status else ''}")
            continue
        if isinstance(body, dict) and key in body:
            return flavour()
        tried.append(f"{path}: no {key!r}")
    raise ServerError("cannot tell which protocol the server speaks (" + "; ".join(tried) + ")",
                      reason="malformed", endpoint="GET " + ", ".join(p for p, _, _ in probes),
                      remedy=f"name the flavour: http:{{{','.join(FLAVOURS)}}}=URL")


__all__ = ["Completion", "FLAVOURS", "Flavour", "Identity", "LlamaServer", "OpenAICompletions",
           "SglangGenerate", "detect"]
