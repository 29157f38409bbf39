"""How a server is named on the command line, and the engine class each name makes.

    http:llama-server              lockstep starts llama.cpp's server on the package's GGUF
    http:llama-server=URL          a llama-server already running at URL
    http:openai=URL                vLLM's or SGLang's OpenAI-compatible /v1/completions
    http:sglang=URL                SGLang's native /generate
    http=URL                       the protocol detected from the server's own endpoints

Each spelling is one engine class (made once per spelling, so one spelling is one engine
everywhere: in the registry, in a worker process, in the records). Its results are recorded
as ``http-llama-server`` for a server lockstep starts, and ``http-<flavour>@<host>-<port>``
for a URL (``http-auto@...`` where the protocol is detected), so two servers in one run
keep their records apart.
"""
from __future__ import annotations

import functools
from urllib.parse import urlsplit

from engines.backends.http.client import check_url
from engines.backends.http.engine import HttpEngine, check_settings
from engines.backends.http.flavours import FLAVOURS
from engines.errors import InputError

PREFIX = "http"
FORMS = ("http:llama-server (lockstep starts it), http:llama-server=URL, http:openai=URL, "
         "http:sglang=URL, or http=URL (the protocol detected)")


def is_http_spelling(ref: str) -> bool:
    """Whether an engines-list entry names a server (``http``, ``http:...``, ``http=...``)."""
    return ref == PREFIX or ref.startswith((PREFIX + ":", PREFIX + "=")) \
        and not ref.startswith(PREFIX + "://")


def parse(ref: str) -> tuple[str | None, str | None]:
    """``(flavour or None to detect, URL or None to start llama-server)``; a spelling that
    is none of the forms is an ``InputError`` naming them."""
    if ref.startswith(PREFIX + "="):
        flavour, url = None, ref[len(PREFIX) + 1:]
    elif ref.startswith(PREFIX + ":"):
        flavour, sep, url = ref[len(PREFIX) + 1:].partition("=")
        url = url if sep else None
    else:
        raise InputError("a server is named with its protocol or its URL", field="--engines",
                         value=ref, remedy=f"write {FORMS}")
    if flavour is not None and flavour not in FLAVOURS:
        raise InputError(f"no server protocol {flavour!r}", field="--engines", value=ref,
                         remedy=f"choose one of {', '.join(FLAVOURS)}: {FORMS}")
    if url is None and flavour != "llama-server":
        raise InputError(f"lockstep starts only llama-server; a server speaking {flavour} "
                         f"needs its URL",
                         field="--engines", value=ref,
                         remedy=f"start the server yourself and write http:{flavour}=URL")
    if url is not None:
        url = check_url(url, "--engines")
    return flavour, url


def engine_name(flavour: str | None, url: str | None) -> str:
    if url is None:
        return f"{PREFIX}-{flavour}"
    parts = urlsplit(url)
    return f"{PREFIX}-{flavour or 'auto'}@{parts.hostname}-{parts.port or 80}"


def engine_class(ref: str, checked: bool = True):
    """The engine class of one spelling (the same class every time it is asked for); the
    environment's settings it will read are checked each time it is named (an
    ``InputError`` naming the variable, before any request), unless ``checked`` is False
    (``lockstep engines``, where its availability gives the reason)."""
    if checked:
        check_settings(starts_server=parse(ref)[1] is None)
    return _made(ref)


@functools.lru_cache(maxsize=None)
def _made(ref: str):
    flavour, url = parse(ref)
    name = engine_name(flavour, url)
    started = "started by lockstep on the package's GGUF" if url is None else f"at {url}"
    return type(f"HttpEngine[{name}]", (HttpEngine,), {
        "name": name, "flavour_name": flavour, "url": url, "spelling": ref,
        "__module__": HttpEngine.__module__,
        "description": f"{flavour or 'a detected'} server over HTTP, {started}"})


__all__ = ["FORMS", "engine_class", "engine_name", "is_http_spelling", "parse"]
