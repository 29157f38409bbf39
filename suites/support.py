"""Plain helpers for the suites (importable; conftest.py holds only fixtures)."""
from __future__ import annotations

HOST_ENGINES = ("ort-cpu", "onnx-reference", "native-host")


def fixture_names() -> list[str]:
    from harness.packages import fixture_names as names

    return names()
