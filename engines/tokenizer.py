"""A package's tokenizer, through ``tokenizers``: text in, ids out, and back.

Decoding never changes what is compared (tokens compare as ids); it exists so evidence
and reports can show the text a stream stands for.
"""
from __future__ import annotations

from collections.abc import Sequence

from engines.errors import EngineUnavailable, PackageError


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


def package_tokenizer(package) -> PackageTokenizer | None:
    """The package's tokenizer, or None when it declares none."""
    path = package.tokenizer_path
    return None if path is None else PackageTokenizer(path)


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
