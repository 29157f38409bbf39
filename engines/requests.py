"""Checks on a decode request, made on the host before anything runs or crosses.

Below the workflow interpreter so that the interpreter, the oracle and engines that decode by
themselves (``Engine.generate``) validate a request the same way; ``engines.workflow.validation``
re-exports these names.
"""
from __future__ import annotations

from collections.abc import Sequence

from engines.errors import InputError


def check_token_ids(ids: Sequence[int], vocab_size: int, field: str = "prompt") -> list[int]:
    """Every id an int in [0, vocab_size); a bad one names its index, value and the range."""
    out = []
    for i, tok in enumerate(ids):
        if isinstance(tok, bool) or not isinstance(tok, (int,)) and not hasattr(tok, "__index__"):
            raise InputError("token id is not an integer", field=f"{field}[{i}]", value=tok,
                             remedy="give integer token ids")
        tok = int(tok)
        if not 0 <= tok < vocab_size:
            raise InputError("token id out of range", field=f"{field}[{i}]", value=tok,
                             remedy=f"token ids must lie in [0, {vocab_size}) for this package "
                                    f"(vocab_size {vocab_size})")
        out.append(tok)
    return out


def check_count(value, field: str, remedy: str, minimum: int = 1) -> int:
    """A count (an int, not a bool) of at least ``minimum``; anything else is an
    ``InputError`` naming ``field``, the value and ``remedy``. One check for the counts the
    library and the CLI take (max_prompts, max_new_tokens, repeats, warm-ups)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{field} must be an integer of at least {minimum}", field=field,
                         value=value, remedy=remedy)
    if value < minimum:
        raise InputError(f"{field} must be at least {minimum}", field=field, value=value,
                         remedy=remedy)
    return value


def check_request(spec, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Validate a greedy request against the package: ids, lengths and the context."""
    if max_new_tokens < 1:
        raise InputError("max_new_tokens must be at least 1", field="max_new_tokens",
                         value=max_new_tokens, remedy="ask for one or more new tokens")
    if len(prompt) == 0:
        raise InputError("the prompt is empty", field="prompt", value=list(prompt),
                         remedy="give at least one token id (the package's bos_id is a good start)")
    ids = check_token_ids(prompt, spec.vocab_size)
    need = len(ids) + max_new_tokens
    if len(ids) > spec.max_context:
        raise InputError("prompt longer than the context", field="prompt", value=f"{len(ids)} tokens",
                         remedy=f"shorten the prompt to at most {spec.max_context} tokens "
                                f"(max_context of {spec.name})")
    if need > spec.max_context:
        raise InputError("prompt plus new tokens exceed the context", field="max_new_tokens",
                         value=max_new_tokens,
                         remedy=f"ask for at most {spec.max_context - len(ids)} new tokens after a "
                                f"{len(ids)}-token prompt (max_context {spec.max_context})")
    return ids


__all__ = ["check_count", "check_request", "check_token_ids"]
