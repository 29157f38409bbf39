"""A package's tokenizer, through ``tokenizers``: text in, ids out, and back; and its chat
template, through jinja2.

Decoding never changes what is compared (tokens compare as ids); it exists so evidence
and reports can show the text a stream stands for.

The chat template is the checkpoint's own (GGUF ``tokenizer.chat_template``, or a Hugging Face
folder's ``tokenizer_config.json``), carried by the converter into ``chat_template.jinja``
beside the package's tokenizer file: the name transformers gives it in a saved tokenizer
folder. It is rendered as transformers renders it (a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception``, a ``tojson`` that keeps non-ASCII
text, the tokenizer's special tokens as variables) and the text is encoded without the
tokenizer's own special-token template, because the chat template writes those itself.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engines.errors import EngineUnavailable, PackageError
from engines.package.file_identity import IdentityMemo, identity


class PackageTokenizer:
    """``encode`` / ``decode`` over the package's ``tokenizer.json``."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise EngineUnavailable("reading a package's tokenizer needs the tokenizers package",
                                    field="tokenizers", value=None,
                                    remedy="pip install 'lockstep[real]'") from None
        self.path = path
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise PackageError(f"the tokenizer cannot be loaded: {exc}", field="tokenizer.path",
                               value=str(path), remedy="rebuild the package's tokenizer.json",
                               where=str(path)) from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids for ``text``; special markers written in the text (``<|im_start|>``) encode
        to their single ids. ``add_special_tokens`` applies the tokenizer's template."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_ROLES = ("system", "user", "assistant")


class ChatTemplate:
    """A checkpoint's chat template: ``render(messages)`` is the text the model expects."""

    def __init__(self, source: str, where: str = "", special_tokens: dict | None = None):
        self.source, self.where = source, where
        self.special_tokens = dict(special_tokens or {})
        self._error = jinja2.TemplateError

        def raise_exception(message):
            raise jinja2.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise PackageError(f"the chat template does not parse: {exc}",
                               field=CHAT_TEMPLATE_FILE, value=where or None,
                               remedy="convert the checkpoint again, or fix its chat template",
                               where=where or None) from None

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as text, ending with the assistant's turn opened when
        ``add_generation_prompt``; a template that raises is a ``PackageError``."""
        try:
            return self._template.render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         **self.special_tokens)
        except Exception as exc:  # the template is the package's code: any failure is its
            kind = "" if isinstance(exc, self._error) else f"{type(exc).__name__}: "
            raise PackageError(f"the chat template refused the conversation: {kind}{exc}",
                               field=CHAT_TEMPLATE_FILE, value=self.where or None,
                               remedy="give the roles and order the checkpoint's template "
                                      f"expects, or fix {CHAT_TEMPLATE_FILE}",
                               where=self.where or None) from None


def chat_template_path(package) -> Path | None:
    """``chat_template.jinja`` beside the package's tokenizer file, when the package has one."""
    tok = package.tokenizer_path
    if tok is None:
        return None
    path = tok.parent / CHAT_TEMPLATE_FILE
    return path if path.is_file() else None


def package_chat_template(package, tokenizer: PackageTokenizer | None = None) -> ChatTemplate | None:
    """The package's chat template (None when it has none), with the bos and eos tokens
    of ``tokenizer`` (or the package's) as ``bos_token`` / ``eos_token``."""
    path = chat_template_path(package)
    if path is None:
        return None
    tokenizer = tokenizer or package_tokenizer(package)
    special = {}
    for key, tid in (("bos_token", package.spec.bos_id), ("eos_token", package.spec.eos_id)):
        if tid is not None and tokenizer is not None:
            special[key] = tokenizer.decode([tid])
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PackageError(f"{CHAT_TEMPLATE_FILE} is not UTF-8 text ({exc.reason} at byte "
                           f"{exc.start})", field=CHAT_TEMPLATE_FILE, value=str(path),
                           remedy="convert the checkpoint again, or fix its chat template",
                           where=str(path)) from None
    return ChatTemplate(source, str(path), special)


_LOADED = IdentityMemo(size=8)


def package_tokenizer(package) -> PackageTokenizer | None:
    """The package's tokenizer, or None when it declares none. A real vocabulary takes a
    tenth of a second to load and every record decodes its stream: the last few are kept, by
    the file's identity (a tokenizer.json written again is loaded again)."""
    path = package.tokenizer_path
    if path is None:
        return None
    path = Path(path)
    try:
        key = (str(path.resolve()), identity(path.stat()))
    except OSError:
        return PackageTokenizer(path)  # its own error names the file
    return _LOADED.get(key, lambda: PackageTokenizer(path))


def decode_or_none(package, ids: Sequence[int]) -> str | None:
    """Text for ``ids`` when the package has a tokenizer and ``tokenizers`` is installed."""
    try:
        tok = package_tokenizer(package)
    except EngineUnavailable:
        return None
    return None if tok is None else tok.decode(ids)


def decode_each(package, ids: Sequence[int], joined: bool = False):
    """Per-token text for evidence and reports (or the joined text with ``joined``); None
    where the package has no tokenizer or ``tokenizers`` is missing."""
    try:
        tok = package_tokenizer(package)
    except EngineUnavailable:
        return None
    if tok is None:
        return None
    return tok.decode(list(ids)) if joined else [tok.decode([int(t)]) for t in ids]
