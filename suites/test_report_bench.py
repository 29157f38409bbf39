"""The report's speed section (``lockstep report --bench``): a real bench file (timed here on
the host) becomes one table whose rows are the file's, with its settings as the caption;
files that are not bench files are refused naming the file and the field."""
from __future__ import annotations

import json

import pytest

from engines.errors import LockstepError
from harness.bench import FORMAT
from reports import render_report
from reports.bench_tables import load_bench
from suites.test_report import parse

PACKAGE = "tiny_llama"


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    from harness.cli import main

    path = tmp_path_factory.mktemp("bench") / "bench.json"
    status = main(["bench", "--engines", "native-host", "--packages", PACKAGE, "--repeats", "1",
                   "--max-new-tokens", "3", "--ignore-eos", "--json", str(path)])
    assert status == 0
    return path


@pytest.fixture(scope="module")
def evidence_dir(tmp_path_factory):
    """A real evidence folder for the CLI to render beside the bench file."""
    from harness.cli import main

    folder = tmp_path_factory.mktemp("evidence")
    assert main(["run", "--engines", "native-host", "--packages", PACKAGE, "--max-prompts",
                 "1", "--max-new-tokens", "2", "--evidence-dir", str(folder)]) == 0
    return folder


def _texts(node) -> str:
    return " ".join(c if isinstance(c, str) else _texts(c) for c in node.children)


def _find(node, pred):
    if not isinstance(node, str) and pred(node):
        yield node
    for child in getattr(node, "children", ()):
        if not isinstance(child, str):
            yield from _find(child, pred)


def test_each_bench_row_is_a_table_row_with_the_files_figures(bench_file):
    data = json.loads(bench_file.read_text())
    dom = parse(render_report([], bench=[bench_file]))
    section = next(_find(dom, lambda n: n.attrs.get("id") == "speed"))
    rows = list(_find(section, lambda n: n.tag == "tr" and "bench-row" in n.attrs.get("class", "")))
    assert [r.attrs["data-engine"] for r in rows] == [r["engine"] for r in data["rows"]]
    assert {r["engine"] for r in data["rows"]} == {"native-host", "ort-cpu"}  # the baseline joins
    for tr, row in zip(rows, data["rows"]):
        text = _texts(tr)
        assert row["package"] in text and row["prompt_set"] in text
        assert row["compute_dtype"] == "float32" and "float32" in text
        assert f"{row['decode_ms']:.3f}" in text and f"{row['x_floor']:.1f}x" in text
        assert f"{row['ratio']:.2f}x" in text
    caption = _texts(next(_find(section, lambda n: "bench-caption" in n.attrs.get("class", ""))))
    assert "3 new tokens" in caption and "eos ignored" in caption and "median of 1" in caption
    assert "ratio to ort-cpu" in caption and "pipelined" not in caption


def test_a_compared_engine_is_a_column_of_ratios_and_named_in_the_caption(tmp_path):
    """``lockstep bench --compare-to``: each compared engine's ratios are a column of the
    table, every row's cell the file's ratio to that engine (empty where none)."""
    from harness.cli import main

    path = tmp_path / "bench.json"
    assert main(["bench", "--engines", "native-host", "--packages", PACKAGE, "--repeats", "1",
                 "--max-new-tokens", "3", "--ignore-eos", "--compare-to", "native-host",
                 "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    dom = parse(render_report([], bench=[path]))
    section = next(_find(dom, lambda n: n.attrs.get("id") == "speed"))
    heads = [_texts(th) for th in _find(section, lambda n: n.tag == "th")]
    assert heads[-2:] == ["x native-host", "note"]
    cells = list(_find(section, lambda n: "bench-compare" in n.attrs.get("class", "")))
    assert [c.attrs["data-to"] for c in cells] == ["native-host"] * len(data["rows"])
    for cell, row in zip(cells, data["rows"]):
        assert _texts(cell).strip() == f"{row['ratios']['native-host']:.2f}x"
    caption = _texts(next(_find(section, lambda n: "bench-caption" in n.attrs.get("class", ""))))
    assert "ratio to ort-cpu, native-host in this run" in caption


def test_no_bench_file_no_speed_section():
    assert 'id="speed"' not in render_report([])


def test_the_cli_renders_the_section(bench_file, evidence_dir, tmp_path):
    from harness.cli import main

    out = tmp_path / "report.html"
    assert main(["report", str(evidence_dir), "--no-catch-matrix", "--bench", str(bench_file),
                 "-o", str(out)]) == 0
    assert out.read_text().count('class="bench-row"') == 2


@pytest.mark.parametrize("content, field", [
    ("not json", "--bench"),
    (json.dumps({"format": FORMAT, "kind": "lockstep-evidence", "rows": []}), "--bench kind"),
    (json.dumps({"format": FORMAT, "kind": "lockstep-bench"}), "--bench rows"),
    (json.dumps({"format": FORMAT, "kind": "lockstep-bench",
                 "rows": [{"engine": "x", "package": "p", "mode": "greedy", "status": "ok",
                           "decode_ms": "fast"}]}), "--bench rows.0.decode_ms"),
    (json.dumps({"format": FORMAT + 1, "kind": "lockstep-bench", "rows": []}),
     "--bench format"),
])
def test_a_file_that_is_not_a_bench_file_is_refused_naming_the_field(tmp_path, content,
                                                                      field):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(LockstepError) as info:
        load_bench(path)
    assert info.value.field == field and info.value.remedy
    assert "bad.json" in str(info.value) or info.value.value == str(path)


def test_a_missing_bench_file_fails_the_cli_with_the_path(evidence_dir, tmp_path, capsys):
    from harness.cli import main

    missing = tmp_path / "nope.json"
    status = main(["report", str(evidence_dir), "--no-catch-matrix", "--bench", str(missing),
                   "-o", str(tmp_path / "r.html")])
    assert status != 0
    err = capsys.readouterr().err
    assert "nope.json" in err and "--bench" in err
    assert not (tmp_path / "r.html").exists()
