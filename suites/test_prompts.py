"""Prompts as text, as a chat, or from a JSONL file (``lockstep run --text/--chat/--prompts``):
encoded by the package's own tokenizer and chat template as transformers would, recorded in
evidence and the report, and every bad input refused naming where, what and the remedy."""
from __future__ import annotations

import json

import pytest

from engines.errors import InputError, PackageError
from engines.package import load_package
from engines.tokenizer import (CHAT_TEMPLATE_FILE, ChatTemplate, PackageTokenizer,
                               package_chat_template, package_tokenizer)
from harness.cli import main
from harness.evidence import load_evidence_dir
from harness.packages import resolve_package
from harness.prompts import (chat_prompt, ids_prompt, read_prompts_file, resolve, text_prompt)
from suites.convert_support import write_tiny_hf

pytestmark = pytest.mark.claim("token_identity")

# A ChatML template in the style of SmolLM2's (a default system turn when none is given).
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are terse.<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ("system user assistant you are terse the a cat dog sat on mat what is capital of france "
         "paris tell me story once upon time there was little red fox ran far away hello world "
         "and it then").split()
VOCAB = 300  # write_tiny_hf's vocabulary


def _tokenizer():
    """A word-level tokenizer (ids within the tiny checkpoint's vocabulary), ChatML markers
    as special tokens, and a bos added to plain text as a post-processor."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


@pytest.fixture(scope="module")
def chat_package(tmp_path_factory):
    """A tiny Hugging Face folder with tokenizer.json and a chat template in
    tokenizer_config.json, converted: the package carries both."""
    from harness.convert.conversion import convert

    root = tmp_path_factory.mktemp("chat")
    folder = write_tiny_hf(root / "hf", vocab=VOCAB)
    _tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    result = convert(folder, root / "pkg")
    return load_package(result.folder), folder


def test_the_converter_carries_the_chat_template_into_the_package(chat_package):
    package, _ = chat_package
    assert (package.root / CHAT_TEMPLATE_FILE).read_text() == TEMPLATE
    assert package_chat_template(package).source == TEMPLATE


def test_the_converter_carries_a_gguf_chat_template_too(tmp_path, monkeypatch):
    """A GGUF's ``tokenizer.chat_template`` lands in the package as the HF folder's does
    (the tiny GGUF writer is given the template as it writes the tokenizer's eos id)."""
    gguf = pytest.importorskip("gguf")
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_gguf

    plain = gguf.GGUFWriter.add_eos_token_id

    def with_template(self, value):
        plain(self, value)
        self.add_chat_template(TEMPLATE)

    monkeypatch.setattr(gguf.GGUFWriter, "add_eos_token_id", with_template)
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    package = load_package(convert(path, tmp_path / "pkg").folder)
    assert (package.root / CHAT_TEMPLATE_FILE).read_text() == TEMPLATE
    got = resolve(chat_prompt([{"role": "user", "content": "hi"}]), package)
    assert got.rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    tok = package_tokenizer(package)
    assert got.ids[0] == tok.token_to_id("<|im_start|>")


def test_chat_matches_transformers_apply_chat_template_on_the_package_files(chat_package):
    from transformers import PreTrainedTokenizerFast

    package, folder = chat_package
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                 bos_token="<s>", eos_token="</s>")
    for messages in ([{"role": "user", "content": "tell me a story"}],
                     [{"role": "system", "content": "you are a fox"},
                      {"role": "user", "content": "what is the capital of france"},
                      {"role": "assistant", "content": "paris"},
                      {"role": "user", "content": "and then"}]):
        got = resolve(chat_prompt(messages), package)
        want = hf.apply_chat_template(messages, chat_template=TEMPLATE,
                                      add_generation_prompt=True, tokenize=False)
        want_ids = hf(want, add_special_tokens=False)["input_ids"]
        assert got.rendered == want
        assert got.ids == want_ids
        assert got.chat_template == TEMPLATE
        assert 1 not in got.ids  # the template writes its markers; no bos added on top


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory):
    """SmolLM2's tokenizer and chat template, read from its GGUF as the converter reads them
    and saved as a package holds them (tokenizer.json, chat_template.jinja)."""
    pytest.importorskip("gguf")
    from engines.shipped_checkpoint import smollm2_path
    from harness.convert.gguf_reader import field_value, open_gguf
    from harness.convert.tokenizer_builder import tokenizer_from_gguf

    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 is not installed (make real)")
    reader = open_gguf(path)
    template = field_value(reader, "tokenizer.chat_template")
    tok = tokenizer_from_gguf(reader)
    folder = tmp_path_factory.mktemp("smollm2_tokenizer")
    tok.save(str(folder / "tokenizer.json"))
    (folder / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
    return folder, template, tok


@pytest.mark.real_checkpoint
def test_smollm2_template_renders_and_encodes_as_transformers_does(smollm2_tokenizer):
    """SmolLM2's own template and tokenizer (from its GGUF): text and ids equal to
    transformers' apply_chat_template for one turn, a system turn, several turns, non-ASCII."""
    from transformers import PreTrainedTokenizerFast

    folder, template, tok = smollm2_tokenizer
    ours = PackageTokenizer(folder / "tokenizer.json")
    chat = ChatTemplate(template, special_tokens={"bos_token": ours.decode([1]),
                                                  "eos_token": ours.decode([2])})
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=ours.decode([1]),
                                 eos_token=ours.decode([2]))
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer in one word."},
         {"role": "user", "content": "Capital of Japan?"}],
        [{"role": "user", "content": "Write a haiku."},
         {"role": "assistant", "content": "Autumn moon rises"},
         {"role": "user", "content": "Another, about the café near the sea — ünïcödé 東京"}],
    ]
    for messages in conversations:
        text = chat.render(messages)
        assert text == hf.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=False, chat_template=template)
        ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                     chat_template=template)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert ours.encode(text) == list(ids)
        assert text.endswith("<|im_start|>assistant\n")
    no_prompt = chat.render(conversations[0], add_generation_prompt=False)
    assert no_prompt == hf.apply_chat_template(conversations[0], add_generation_prompt=False,
                                               tokenize=False, chat_template=template)


def test_text_is_encoded_with_the_tokenizers_own_special_tokens(chat_package):
    package, _ = chat_package
    tok = package_tokenizer(package)
    got = resolve(text_prompt("once upon a time"), package)
    assert got.ids == [1] + tok.encode("once upon a time")
    assert got.source.text == "once upon a time" and got.rendered is None


def test_the_tokenizer_is_kept_until_its_file_is_written_again(chat_package, tmp_path):
    import shutil

    from tokenizers import AddedToken

    from engines.package import load_package

    package = load_package(shutil.copytree(chat_package[0].root, tmp_path / "pkg"))
    first = package_tokenizer(package)
    assert package_tokenizer(package) is first  # loaded once
    path = package.tokenizer_path
    other = _tokenizer()
    other.add_special_tokens([AddedToken("<new>", special=True, normalized=False)])
    other.save(str(path))
    again = package_tokenizer(package)
    assert again is not first and again.vocab_size == first.vocab_size + 1


def test_jsonl_file_mixes_text_chat_and_ids_in_order(chat_package, tmp_path):
    package, _ = chat_package
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "the cat sat", "name": "plain"}\n\n'
                    '{"chat": [{"role": "user", "content": "hello"}]}\n'
                    '{"ids": [1, 7, 9]}\n')
    sources = read_prompts_file(path)
    assert [s.kind for s in sources] == ["text", "chat", "ids"]
    assert [s.where for s in sources] == ["p.jsonl:1 text", "p.jsonl:3", "p.jsonl:4"]
    assert sources[0].name == "plain" and sources[1].name is None
    assert resolve(sources[2], package).ids == [1, 7, 9]


@pytest.mark.parametrize("line, field, words", [
    ('{"text": ""}', "p.jsonl:2 text", "empty"),
    ('{"chat": [{"role": "robot", "content": "hi"}]}', "p.jsonl:2 chat[0].role", "unknown chat role"),
    ('{"chat": [{"role": "user"}]}', "p.jsonl:2 chat[0]", "exactly role and content"),
    ('{"chat": []}', "p.jsonl:2", "non-empty list"),
    ('{"ids": [1, "x"]}', "p.jsonl:2 ids[1]", "not an integer"),
    ('{"text": "a", "ids": [1]}', "p.jsonl:2", "exactly one of"),
    ('{"txt": "a"}', "p.jsonl:2 txt", "unknown field"),
    ('[1, 2]', "p.jsonl:2", "JSON object"),
    ('{"text": "a"', "p.jsonl:2", "not valid JSON"),
    ('{"text": "a", "name": "has space"}', "p.jsonl:2 name", "prompt name"),
    ('{"text": "b", "name": "one"}', "p.jsonl:2 name", "used on line 1"),
    ('{"text": "a", "text": "b"}', "p.jsonl:2 text", "repeated"),
    ('{"chat": [{"role": "user", "role": "system", "content": "hi"}]}', "p.jsonl:2 role",
     "repeated"),
])
def test_a_bad_line_names_its_line_field_value_and_remedy(tmp_path, line, field, words):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "a", "name": "one"}\n' + line + "\n")
    with pytest.raises(InputError) as err:
        read_prompts_file(path)
    assert err.value.field == field
    assert words in str(err.value)
    assert err.value.remedy


def test_empty_text_and_an_empty_file_are_refused(tmp_path):
    with pytest.raises(InputError, match="empty") as err:
        text_prompt("")
    assert err.value.field == "--text"
    (tmp_path / "none.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no prompt"):
        read_prompts_file(tmp_path / "none.jsonl")


def test_ids_out_of_range_name_the_prompt_and_the_range(chat_package):
    package, _ = chat_package
    with pytest.raises(InputError) as err:
        resolve(ids_prompt([1, VOCAB + 5], "p.jsonl:3"), package)
    assert err.value.field == "p.jsonl:3 ids[1]" and err.value.value == VOCAB + 5
    assert f"[0, {VOCAB})" in err.value.remedy


def test_a_prompt_longer_than_the_context_is_refused_with_its_length(chat_package):
    package, _ = chat_package
    context = package.spec.max_context
    long_text = " ".join(["cat"] * context)
    with pytest.raises(InputError) as err:
        resolve(text_prompt(long_text), package)
    assert err.value.field == "--text" and err.value.value == f"{context + 1} tokens"
    assert str(context) in err.value.remedy
    fits = " ".join(["cat"] * (context - 4))
    with pytest.raises(InputError, match="new tokens exceed") as err:
        resolve(text_prompt(fits), package, max_new_tokens=8)
    assert "at most 3 new tokens" in err.value.remedy  # bos + (context - 4) words


def test_text_on_a_package_without_a_tokenizer_names_the_package_and_remedy():
    package = resolve_package("tiny_llama")
    with pytest.raises(PackageError) as err:
        resolve(text_prompt("hello"), package)
    assert "tiny_llama" in str(err.value) and err.value.field == "--text"
    assert "--prompt" in err.value.remedy and "--no-tokenizer" in err.value.remedy


def test_chat_on_a_package_without_a_chat_template_is_refused(chat_package, tmp_path):
    import shutil

    package, _ = chat_package
    copy = tmp_path / "no_template"
    shutil.copytree(package.root, copy)
    (copy / CHAT_TEMPLATE_FILE).unlink()
    with pytest.raises(PackageError, match="no chat template") as err:
        resolve(chat_prompt([{"role": "user", "content": "hi"}]), load_package(copy))
    assert "--text" in err.value.remedy


def test_a_template_that_raises_is_a_package_error_naming_the_template():
    chat = ChatTemplate("{{ raise_exception('only user turns') }}", where="t.jinja")
    with pytest.raises(PackageError, match="only user turns") as err:
        chat.render([{"role": "user", "content": "x"}])
    assert err.value.field == CHAT_TEMPLATE_FILE


def test_run_with_text_chat_and_a_file_records_the_sources_and_the_report_shows_them(
        chat_package, tmp_path, capsys, monkeypatch):
    from reports.render import render_report

    monkeypatch.setenv("COLUMNS", "300")
    package, _ = chat_package
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"ids": [1, 9, 12], "name": "raw"}\n')
    evidence = tmp_path / "ev"
    status = main(["run", "--engines", "native-host", "--packages", str(package.root),
                   "--text", "the little red fox", "--chat", "tell me a story",
                   "--prompts", str(prompts), "--max-new-tokens", "3",
                   "--evidence-dir", str(evidence)])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    records = {r.prompt.name: r for r in load_evidence_dir(evidence)}
    assert set(records) == {"p0", "p1", "raw"}
    text, chat, raw = records["p0"].prompt, records["p1"].prompt, records["raw"].prompt
    assert text.source == "text" and text.source_text == "the little red fox"
    assert text.ids == resolve(text_prompt("the little red fox"), package).ids
    assert chat.source == "chat" and chat.chat_template == TEMPLATE
    assert [(m.role, m.content) for m in chat.messages] == [("user", "tell me a story")]
    assert chat.source_text.startswith("<|im_start|>system\nYou are terse.")
    assert raw.source == "ids" and raw.ids == [1, 9, 12] and raw.chat_template is None
    html = render_report(list(records.values()))
    assert "the little red fox" in html and "tell me a story" in html
    assert "chat template" in html


def test_run_prints_the_text_each_cell_generated(chat_package, tmp_path, capsys):
    """The matrix shows verdicts; a run of text or chat prompts also shows what was said:
    one line per cell, the tokens decoded by the package's tokenizer (as recorded)."""
    from engines.tokenizer import decode_each

    package, _ = chat_package
    evidence = tmp_path / "ev"
    status = main(["run", "--engines", "native-host,ort-cpu", "--packages", str(package.root),
                   "--text", "the little red fox", "--chat", "tell me a story",
                   "--max-new-tokens", "4", "--evidence-dir", str(evidence)])
    out = capsys.readouterr().out
    assert status == 0
    records = load_evidence_dir(evidence)
    assert len(records) == 4
    for r in records:
        text = json.dumps(decode_each(package, r.tokens, joined=True), ensure_ascii=False)
        assert f"{r.package.name} · greedy · {r.engine} · {r.prompt.name}: {text}\n" in out


def test_run_refuses_bad_prompts_before_any_cell_and_exits_2(chat_package, tmp_path, capsys):
    package, _ = chat_package
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"chat": [{"role": "narrator", "content": "x"}]}\n')
    evidence = tmp_path / "ev"
    status = main(["run", "--engines", "native-host", "--packages", str(package.root),
                   "--prompts", str(bad), "--evidence-dir", str(evidence)])
    err = capsys.readouterr().err
    assert status == 2
    assert "bad.jsonl:2 chat[0].role" in err and "narrator" in err and "user" in err
    assert not list(evidence.glob("*.json"))
    status = main(["run", "--engines", "native-host", "--packages", "tiny_llama",
                   "--text", "hello", "--no-evidence"])
    err = capsys.readouterr().err
    assert status == 2 and "tiny_llama" in err and "no tokenizer" in err


@pytest.mark.real_checkpoint
def test_long_context_prompts_are_1k_to_2k_smollm2_tokens_and_deterministic(smollm2_tokenizer):
    """The nightly long-context prompts (harness.prompts_long), counted by SmolLM2's own
    tokenizer and template: each 1000-2048 tokens, with 256 new tokens within the converted
    package's default context, the same on every build."""
    from types import SimpleNamespace

    from harness.convert.writer import DEFAULT_MAX_CONTEXT
    from harness.prompts import chat_prompt
    from harness.prompts_long import long_prompts

    folder, _, _ = smollm2_tokenizer
    context = DEFAULT_MAX_CONTEXT["dynamic"]
    package = SimpleNamespace(
        spec=SimpleNamespace(name="smollm2", vocab_size=49152, max_context=context,
                             bos_id=1, eos_id=2),
        tokenizer_path=folder / "tokenizer.json", yaml_path=folder / "package.yaml")
    lines = long_prompts(package)
    assert lines == long_prompts(package)
    assert [line["name"] for line in lines] == ["long_1k", "long_2k", "long_chat"]
    lengths = {}
    for line in lines:
        source = (text_prompt(line["text"]) if "text" in line
                  else chat_prompt(line["chat"]))
        lengths[line["name"]] = len(resolve(source, package, max_new_tokens=256).ids)
    assert all(1000 <= n <= 2048 for n in lengths.values()), lengths
    assert lengths["long_2k"] > 1800 and lengths["long_1k"] < lengths["long_2k"], lengths


def test_the_built_in_prompt_sets_are_named_chats(chat_package, tmp_path, monkeypatch):
    """``--prompts grounded`` and ``--prompts free``: five named chats each, resolved by a
    package's chat template; a file of that name in the working folder is the file; an
    unknown name that is no file says which sets there are."""
    from harness.prompts import PROMPT_SETS

    package, _ = chat_package
    assert PROMPT_SETS == ("grounded", "free")
    names = set()
    for name in PROMPT_SETS:
        sources = read_prompts_file(name)
        assert len(sources) == 5 and all(s.kind == "chat" and s.name for s in sources)
        assert sources[0].where == f"{name}.jsonl:1"
        names |= {s.name for s in sources}
        assert resolve(sources[0], package).rendered.startswith("<|im_start|>system")
    assert len(names) == 10  # no name used twice across the sets
    monkeypatch.chdir(tmp_path)
    (tmp_path / "free").write_text('{"ids": [1, 2]}\n')
    assert [s.kind for s in read_prompts_file("free")] == ["ids"]
    with pytest.raises(InputError) as err:
        read_prompts_file("groundd")
    assert err.value.field == "--prompts" and "grounded, free" in err.value.remedy
