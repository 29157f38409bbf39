"""The lockstep pytest plugin, exercised on throwaway suites through pytester."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

import harness.pytest_plugin as plugin
from harness import evidence as ev
from suites.test_evidence import make_record

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

NO_CUDA_CONFTEST = """
import harness.pytest_plugin as plugin

def pytest_configure(config):
    plugin.cuda_status.cache_clear()
    plugin._real_cuda_status = plugin.cuda_status
    plugin.cuda_status = lambda: (False, "simulated machine without CUDA")

def pytest_unconfigure(config):
    plugin.cuda_status = plugin._real_cuda_status
"""

GPU_SUITE = """
import pytest

@pytest.mark.gpu
def test_needs_cuda():
    pass

@pytest.mark.gpu
def test_skips_itself():
    pytest.skip("cupy kernel cache missing")

@pytest.mark.gpu
@pytest.mark.xfail(reason="known driver bug", strict=False)
def test_expected_failure():
    assert False

def test_plain_skip():
    pytest.skip("not a gpu test")
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # The lockstep plugin comes from the installed entry point or, if lockstep is not
    # installed, from an explicit -p; the root conftest's guard is tested separately.
    if not _entry_point_installed():
        args = ("-p", "harness.pytest_plugin", *args)
    # in-process runs see lockstep's modules already imported: not a finding here
    return pytester.runpytest("-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def _entry_point_installed() -> bool:
    return any(e.value == "harness.pytest_plugin"
               for e in importlib.metadata.entry_points(group="pytest11"))


def test_gpu_tests_skip_without_cuda_by_default(pytester):
    pytester.makeconftest(NO_CUDA_CONFTEST)
    pytester.makepyfile(GPU_SUITE)
    result = _run(pytester, "-rs")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["*gpu test without CUDA: simulated machine without CUDA*"])


def test_require_gpu_turns_gpu_skips_into_failures_with_the_reason(pytester):
    pytester.makeconftest(NO_CUDA_CONFTEST)
    pytester.makepyfile(GPU_SUITE)
    result = _run(pytester, "--require-gpu", "-rfEs")
    # Without CUDA every gpu test is skipped at setup, so pytest counts the converted
    # report as an error (a setup failure); the plain test's skip stays a skip.
    result.assert_outcomes(errors=3, skipped=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_needs_cuda*",
        "--require-gpu: test marked gpu was skipped*Skip reason: gpu test without CUDA: "
        "simulated machine without CUDA",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_require_gpu_fails_a_gpu_test_that_skips_itself_in_the_call(pytester):
    pytester.makepyfile(GPU_SUITE)
    pytester.makeconftest("""
        import harness.pytest_plugin as plugin

        def pytest_configure(config):
            plugin._real_cuda_status = plugin.cuda_status
            plugin.cuda_status = lambda: (True, "simulated CUDA device")

        def pytest_unconfigure(config):
            plugin.cuda_status = plugin._real_cuda_status
    """)
    result = _run(pytester, "--require-gpu", "-rfs")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines([
        "*_ test_skips_itself _*",
        "--require-gpu: test marked gpu was skipped*Skip reason: cupy kernel cache missing",
        "FAILED *::test_skips_itself*",  # pytest >= 9.2 appends " - <reason>"
        "SKIPPED*not a gpu test*",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    without = _run(pytester, "-rs")
    without.assert_outcomes(passed=1, skipped=2, xfailed=1)


@pytest.mark.skipif(plugin.cuda_status()[0], reason="this machine has CUDA; the simulated "
                    "variant above covers the no-CUDA path here")
def test_require_gpu_fails_on_this_machine_without_cuda(pytester):
    pytester.makepyfile(GPU_SUITE)
    result = _run(pytester, "--require-gpu", "-rE")
    result.assert_outcomes(errors=3, skipped=1)
    result.stdout.fnmatch_lines([f"*Skip reason: gpu test without CUDA: {plugin.cuda_status()[1]}"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_options_reach_the_fixtures(pytester, tmp_path):
    pytester.makepyfile(f"""
        from pathlib import Path

        def test_selection(lockstep_engines, lockstep_packages, evidence_dir):
            assert lockstep_engines == ["ort-cpu", "native-host"]
            assert lockstep_packages == ["tiny_llama", "/some/folder"]
            assert evidence_dir == Path({str(tmp_path / 'ev')!r})
            assert evidence_dir.is_dir()
    """)
    result = _run(pytester, "--engines", "ort-cpu, native-host", "--packages",
                  "tiny_llama,/some/folder", "--evidence-dir", str(tmp_path / "ev"))
    result.assert_outcomes(passed=1)


def test_unknown_engine_is_a_usage_error_listing_the_valid_ones(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = _run(pytester, "--engines", "ort-cpu,warp-drive")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--engines*no engine named 'warp-drive'*remedy*ort-cpu*"])


def test_evidence_dir_defaults_to_a_session_temp_folder(pytester):
    pytester.makepyfile("""
        def test_a(evidence_dir):
            assert evidence_dir.is_dir() and not any(evidence_dir.iterdir())
    """)
    _run(pytester).assert_outcomes(passed=1)


def test_assert_token_identity_passes_equal_and_fails_with_step_tokens_margin(pytester):
    pytester.makepyfile("""
        def test_equal(assert_token_identity):
            assert_token_identity([1, 2, 3], [1, 2, 3])

        def test_differs(assert_token_identity):
            assert_token_identity([1, 2, 3, 4], [1, 2, 9, 4], margins=[5.0, 4.0, 0.0125, 1.0],
                                  label="ort-cpu vs oracle")

        def test_shorter(assert_token_identity):
            assert_token_identity([1, 2, 3], [1, 2])
    """)
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*token streams differ (ort-cpu vs oracle) at step 2: reference 3, engine 9*",
        "*reference top-2 logit margin at step 2: 0.0125*",
        "*token streams differ at step 2: reference 3, engine <ended>*",
    ])


def test_report_option_renders_the_evidence_written_by_the_session(pytester, tmp_path):
    evidence = tmp_path / "evidence"
    report = tmp_path / "out" / "parity.html"
    ev.write_evidence(make_record(engine="from-before"), evidence)
    pytester.makepyfile("""
        from suites.test_evidence import make_record
        from harness.evidence import write_evidence

        def test_writes(evidence_dir):
            write_evidence(make_record(engine="written-in-session"), evidence_dir)
    """)
    pytester.syspathinsert(str(Path(__file__).resolve().parents[1]))
    result = _run(pytester, "--evidence-dir", str(evidence), "--report", str(report))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*lockstep: report of 2 evidence record(s) written to {report}*"])
    html = report.read_text(encoding="utf-8")
    assert "written-in-session" in html and "from-before" in html


def test_report_from_bad_evidence_fails_the_session_and_names_the_file(pytester, tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "half.json").write_text('{"schema_version": 1, "run')
    pytester.makepyfile("def test_ok(): pass")
    result = _run(pytester, "--evidence-dir", str(evidence), "--report",
                  str(tmp_path / "r.html"))
    result.stdout.fnmatch_lines([f"*lockstep: report not written: {evidence / 'half.json'}*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_root_conftest_and_entry_point_register_the_plugin_once(pytester, monkeypatch):
    """The repository's own conftest next to an installed entry point: no double
    registration; with autoload off, the conftest alone provides the options."""
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile("""
        def test_once(request):
            pm = request.config.pluginmanager
            import harness.pytest_plugin as plugin
            assert pm.is_registered(plugin)
            assert [p for p in pm.get_plugins() if p is plugin] == [plugin]
            assert request.config.getoption("--require-gpu") is True
    """)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: x\n    slow: x\n    real_checkpoint: x\n")
    pytester.runpytest("--require-gpu").assert_outcomes(passed=1)
    pytester.runpytest("--require-gpu", "-p", "lockstep").assert_outcomes(passed=1)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.runpytest("--require-gpu").assert_outcomes(passed=1)


def test_markers_are_declared_for_a_users_own_suite(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.slow
        @pytest.mark.real_checkpoint
        def test_marked():
            pass
    """)
    _run(pytester, "--strict-markers").assert_outcomes(passed=1)


def test_transfer_guard_fixture_is_imported_lazily(pytester):
    pytester.makepyfile("""
        def test_uses_guard(transfer_guard):
            assert callable(transfer_guard)
    """)
    result = _run(pytester)
    try:
        import harness.transfer_guard  # noqa: F401
    except ImportError:
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(["*harness.transfer_guard cannot be imported*"])
    else:
        result.assert_outcomes(passed=1)


def test_claim_markers_are_validated_at_collection(pytester):
    """An unknown claim id in ``@pytest.mark.claim`` stops the run, naming the test, the id
    and the valid ids (harness/claims.py); a known one runs."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.claim("token_identity")
        def test_known():
            pass

        @pytest.mark.claim("tokens_look_fine")
        def test_unknown():
            pass
    """)
    result = _run(pytester)
    assert result.ret != 0
    text = result.stdout.str() + result.stderr.str()
    assert "unknown claim 'tokens_look_fine'" in text and "token_identity" in text
    pytester.makepyfile(test_unknown="""
        import pytest

        @pytest.mark.claim("readback_budget")
        def test_known():
            pass
    """)
    assert _run(pytester, "test_unknown.py").ret == 0
