"""Prompts given as text, as a chat, or as ids, turned into token ids per package.

``lockstep run --text``, ``--chat`` and ``--prompts FILE`` describe a prompt before any
tokenizer sees it (a ``PromptSource``); each package of the run resolves it with its own
tokenizer and chat template (``resolve``), so one request serves several packages. Every
check names where the prompt came from (``--text``, ``prompts.jsonl:3``), the field, the
value and the remedy, and runs before any cell does.

``--prompts`` also takes the name of a built-in prompt set (``PROMPT_SETS``, JSONL files in
``harness/texts/prompt_sets/``, our own text, chat form): ``grounded`` asks to repeat, edit,
correct or summarise a text or code given in the prompt (where an answer copies its prompt,
and prompt-lookup speculation should win); ``free`` asks open questions (free continuation,
where it should not).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engines import json_text
from engines.errors import InputError, PackageError
from engines.requests import check_token_ids
from engines.tokenizer import (CHAT_ROLES, CHAT_TEMPLATE_FILE, package_chat_template,
                               package_tokenizer)

KINDS = ("text", "chat", "ids")
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
JSONL_REMEDY = ('write one JSON object a line: {"text": "..."}, {"chat": [{"role": "user", '
                '"content": "..."}]} or {"ids": [1, 5, 7]}, with an optional "name"')
PROMPT_SETS_DIR = Path(__file__).resolve().parent / "texts" / "prompt_sets"
PROMPT_SETS = ("grounded", "free")  # the built-in sets --prompts names (PROMPT_SETS_DIR)


@dataclass(frozen=True)
class PromptSource:
    """A prompt as given: ``kind`` text, chat (``messages``: role/content pairs) or ids."""
    kind: str
    where: str  # "--text", "--chat", "--prompt", "prompts.jsonl:3": named in every error
    text: str | None = None
    messages: tuple[tuple[str, str], ...] = ()
    ids: tuple[int, ...] = ()
    name: str | None = None  # the prompt's name in records (default p0, p1, ...)


@dataclass(frozen=True)
class ResolvedPrompt:
    """A prompt's ids for one package, and what they were made from (for evidence)."""
    ids: list[int]
    source: PromptSource
    rendered: str | None = None  # the chat template's output (chat prompts)
    chat_template: str | None = None  # the template's source text (chat prompts)


def text_prompt(text: str, where: str = "--text", name: str | None = None) -> PromptSource:
    if not isinstance(text, str) or text == "":
        raise InputError("the prompt text is empty" if text == "" else "the prompt text is "
                         "not a string", field=where, value=text,
                         remedy="give some text to encode, e.g. --text \"Once upon a time\"")
    _check_characters(text, where)
    return PromptSource("text", where, text=text, name=name)


def _check_characters(text: str, field: str) -> None:
    """Refuse a lone UTF-16 surrogate: it is no character, so no tokenizer encodes it. It
    comes from bytes that are not UTF-8 on a command line (Python keeps each as one) or from
    half a surrogate pair escaped in JSON (``"\\ud800"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"the text holds a lone surrogate {text[exc.start]!r} at character "
                         f"{exc.start}, which is not a character", field=field,
                         value=text[max(0, exc.start - 20):exc.start + 20],
                         remedy="give UTF-8 text: re-encode the bytes that are not UTF-8, or "
                                "write a character outside the BMP as both halves of its "
                                "surrogate pair") from None


def chat_prompt(messages, where: str = "--chat", name: str | None = None) -> PromptSource:
    """Messages as ``[{"role": ..., "content": ...}, ...]``, each checked."""
    if not isinstance(messages, list) or not messages:
        raise InputError("a chat is a non-empty list of messages", field=where, value=messages,
                         remedy='give [{"role": "user", "content": "..."}]')
    out = []
    for i, m in enumerate(messages):
        field = f"{where} chat[{i}]"
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise InputError("a chat message is an object with exactly role and content",
                             field=field, value=m,
                             remedy='write {"role": "user", "content": "..."}')
        role, content = m["role"], m["content"]
        if role not in CHAT_ROLES:
            raise InputError("unknown chat role", field=f"{field}.role", value=role,
                             remedy=f"use one of: {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str) or not content:
            raise InputError("a chat message's content is a non-empty string",
                             field=f"{field}.content", value=content,
                             remedy="give the message's text")
        _check_characters(content, f"{field}.content")
        out.append((role, content))
    return PromptSource("chat", where, messages=tuple(out), name=name)


def ids_prompt(ids, where: str = "--prompt", name: str | None = None) -> PromptSource:
    if not isinstance(ids, (list, tuple)) or not ids:
        raise InputError("ids is a non-empty list of token ids", field=f"{where} ids",
                         value=ids, remedy="give integer token ids, e.g. [1, 5, 7]")
    out = []
    for i, t in enumerate(ids):
        try:
            if isinstance(t, bool):
                raise TypeError
            out.append(operator.index(t))
        except TypeError:
            raise InputError("token id is not an integer", field=f"{where} ids[{i}]", value=t,
                             remedy="give integer token ids") from None
    return PromptSource("ids", where, ids=tuple(out), name=name)


def prompt_set_file(ref: str | Path) -> Path:
    """The file ``--prompts`` names: a path that exists, else a built-in set's file."""
    path = Path(ref)
    if not path.exists() and str(ref) in PROMPT_SETS:
        return PROMPT_SETS_DIR / f"{ref}.jsonl"
    return path


def read_prompts_file(path: str | Path) -> list[PromptSource]:
    """``--prompts FILE``: one JSON object a line (blank lines skipped), each checked; FILE
    may name a built-in set (``PROMPT_SETS``) instead."""
    path = prompt_set_file(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"the prompts file cannot be read: {exc}", field="--prompts",
                         value=str(path), remedy=f"give a UTF-8 JSONL file, or a built-in "
                                                 f"set: {', '.join(PROMPT_SETS)}") from None
    sources, names = [], {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            item = json_text.loads(line, unique_keys=True)
        except json_text.RepeatedKey as exc:
            raise InputError(str(exc), field=f"{where} {exc.key}", value=line[:80],
                             remedy="give each key once", where=str(path)) from None
        except ValueError as exc:
            raise InputError(f"not valid JSON ({exc.args[0] if exc.args else exc})",
                             field=where, value=line[:80], remedy=JSONL_REMEDY,
                             where=str(path)) from None
        sources.append(_source_of(item, where))
        name = sources[-1].name
        if name is not None:
            if name in names:
                raise InputError(f"prompt name {name!r} is used on line {names[name]} too",
                                 field=f"{where} name", value=name,
                                 remedy="give every prompt its own name", where=str(path))
            names[name] = number
    if not sources:
        raise InputError("the prompts file holds no prompt", field="--prompts",
                         value=str(path), remedy=JSONL_REMEDY)
    return sources


def _source_of(item, where: str) -> PromptSource:
    if not isinstance(item, dict):
        raise InputError("a line must be a JSON object", field=where, value=item,
                         remedy=JSONL_REMEDY)
    kinds = [k for k in KINDS if k in item]
    unknown = sorted(set(item) - set(KINDS) - {"name"})
    if unknown:
        raise InputError(f"unknown field {unknown[0]!r}", field=f"{where} {unknown[0]}",
                         value=item[unknown[0]], remedy=JSONL_REMEDY)
    if len(kinds) != 1:
        raise InputError("a line holds exactly one of text, chat or ids", field=where,
                         value=sorted(item), remedy=JSONL_REMEDY)
    name = item.get("name")
    if name is not None and (not isinstance(name, str) or not NAME.match(name)):
        raise InputError("a prompt name is 1-64 letters, digits, '_', '.' or '-'",
                         field=f"{where} name", value=name, remedy='e.g. "long_2k"')
    kind = kinds[0]
    if kind == "text":
        return text_prompt(item["text"], f"{where} text", name)
    if kind == "chat":
        return chat_prompt(item["chat"], where, name)
    return ids_prompt(item["ids"], where, name)


def resolve(source: PromptSource, package, max_new_tokens: int | None = None) -> ResolvedPrompt:
    """The prompt's ids for ``package``: text through its tokenizer (with the tokenizer's own
    special-token template, as transformers encodes text), a chat through its chat template,
    ids as given; each checked against the vocabulary and, with ``max_new_tokens``, the
    context."""
    spec = package.spec
    rendered = template = None
    if source.kind == "ids":
        ids = check_token_ids(source.ids, spec.vocab_size, field=f"{source.where} ids")
    else:
        tok = package_tokenizer(package)
        if tok is None:
            raise PackageError(f"package {spec.name!r} has no tokenizer, so a {source.kind} "
                               f"prompt cannot be encoded", field=source.where,
                               value=spec.name,
                               remedy="give the prompt as ids (--prompt or {\"ids\": [...]}), "
                                      "or convert the checkpoint with its tokenizer (lockstep "
                                      "convert without --no-tokenizer)",
                               where=str(package.yaml_path))
        if source.kind == "text":
            ids = tok.encode(source.text, add_special_tokens=True)
        else:
            chat = package_chat_template(package, tok)
            if chat is None:
                raise PackageError(f"package {spec.name!r} has no chat template",
                                   field=source.where, value=spec.name,
                                   remedy=f"give the prompt as text (--text), or convert a "
                                          f"checkpoint that carries one (it is written to "
                                          f"{CHAT_TEMPLATE_FILE} beside the tokenizer)",
                                   where=str(package.yaml_path))
            template = chat.source
            rendered = chat.render([{"role": r, "content": c} for r, c in source.messages])
            ids = tok.encode(rendered, add_special_tokens=False)
        if not ids and source.kind == "chat":  # the messages hold text: the template lost it
            raise PackageError(f"the chat template rendered the conversation as {rendered!r}, "
                               f"which encodes to no tokens", field=CHAT_TEMPLATE_FILE,
                               value=chat.where or None,
                               remedy=f"fix {CHAT_TEMPLATE_FILE} so that it renders the "
                                      f"messages, or convert the checkpoint again",
                               where=chat.where or None)
        if not ids:
            raise InputError("the prompt encodes to no tokens", field=source.where,
                             value=source.text,
                             remedy="give text the tokenizer turns into at least one token")
        ids = check_token_ids(ids, spec.vocab_size, field=f"{source.where} (encoded)")
    if len(ids) > spec.max_context:
        raise InputError(f"the prompt is {len(ids)} tokens, longer than the context of "
                         f"{spec.name!r}", field=source.where, value=f"{len(ids)} tokens",
                         remedy=f"shorten it to at most {spec.max_context} tokens (max_context "
                                f"of {spec.name}), or convert with a larger --max-context")
    if max_new_tokens is not None and len(ids) + max_new_tokens > spec.max_context:
        raise InputError(f"a {len(ids)}-token prompt plus {max_new_tokens} new tokens exceed "
                         f"the context of {spec.name!r} ({spec.max_context})",
                         field=source.where, value=f"{len(ids)} tokens",
                         remedy=f"ask for at most {spec.max_context - len(ids)} new tokens "
                                f"(--max-new-tokens), or shorten the prompt")
    return ResolvedPrompt(ids, source, rendered, template)


def resolve_all(prompts: Sequence, package, max_new_tokens: int | None = None
                ) -> list[tuple[str, ResolvedPrompt]]:
    """(name, resolved) for each prompt, in order: a ``PromptSource`` or a list of ids (named
    p0, p1, ... unless it names itself)."""
    out = []
    for i, p in enumerate(prompts):
        source = p if isinstance(p, PromptSource) else ids_prompt(list(p), f"prompt {i}")
        out.append((source.name or f"p{i}", resolve(source, package, max_new_tokens)))
    return out


__all__ = ["PROMPT_SETS", "PromptSource", "ResolvedPrompt", "chat_prompt", "ids_prompt",
           "prompt_set_file", "read_prompts_file", "resolve", "resolve_all", "text_prompt"]
