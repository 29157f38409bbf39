"""transformers without its progress bars, where lockstep loads a model through it.

A bar per load ("Loading weights", "Converting and de-quantizing GGUF tensors...") lands in
every CI log and between lockstep's own progress lines. transformers' switch
(``disable_progress_bar``) covers its weight loader; its GGUF reader calls ``tqdm`` directly,
so inside the block that module's ``tqdm`` goes through the same switch. Both are restored
after, so a program that uses lockstep as a library keeps its own settings.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def quiet_transformers():
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_on, direct = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = hf_logging.tqdm  # transformers' own tqdm: off while the switch is
    try:
        yield
    finally:
        gguf_utils.tqdm = direct
        if was_on:
            hf_logging.enable_progress_bar()
