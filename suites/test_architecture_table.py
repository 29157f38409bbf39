"""The converter's families are one table (``harness/convert/architectures.py``), and every
place that names them reads it: the readers, the refusals, ``lockstep convert --help``,
docs/CONVERTER.md's table and the architecture tests' configurations."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engines.errors import InputError
from harness.cli import main
from harness.convert import errors
from harness.convert.architectures import (BY_HF_CLASS, FAMILIES, GGUF_FAMILIES, with_table)
from harness.convert.hf_reader import profile_of
from suites import architecture_checkpoints

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_table_is_the_table():
    page = (ROOT / "docs" / "CONVERTER.md").read_text()
    assert with_table(page) == page, \
        "docs/CONVERTER.md is stale: python -m harness.convert.architectures docs/CONVERTER.md"


def test_the_cli_help_names_every_family(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(f.title in shown for f in FAMILIES)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_reader_takes_each_row_and_its_test_builds_it(family):
    assert profile_of({"architectures": [family.hf_class]}, "config.json") is family.profile
    assert family.name in architecture_checkpoints.FAMILIES  # a tiny checkpoint of it
    if family.gguf is not None:  # and, read from GGUF too, one written as llama.cpp does
        assert family.name in architecture_checkpoints.GGUF_ARCH.values()


def test_an_architecture_off_the_table_is_refused_naming_the_table():
    with pytest.raises(InputError) as err:
        profile_of({"architectures": ["BertForMaskedLM"]}, "config.json")
    assert err.value.field == "architectures"
    assert re.findall(r"\w+ForCausalLM", err.value.remedy) == list(BY_HF_CLASS)


def test_gguf_refusals_name_the_gguf_rows():
    unknown = errors.unsupported_gguf_architecture("bert", "model.gguf")
    assert unknown.remedy.endswith(", ".join(GGUF_FAMILIES))
    for family in FAMILIES:
        if family.gguf is None:  # read from its Hugging Face form only, and told so
            refusal = errors.unsupported_gguf_architecture(family.name, "model.gguf")
            assert "Hugging Face folder" in refusal.remedy, family.name
