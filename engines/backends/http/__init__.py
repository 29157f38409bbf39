"""Servers over HTTP as engines: llama.cpp's ``llama-server``, vLLM's and SGLang's
OpenAI-compatible completions, SGLang's ``/generate``.

``client``: JSON requests with a deadline and safe retries; ``flavours``: each protocol's
request and reply; ``server_process`` and ``server_build``: the ``llama-server`` lockstep
builds and starts; ``engine``: the black-box engine; ``spelling``: ``--engines http:...``.
"""
