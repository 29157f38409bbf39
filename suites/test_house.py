"""The house's own rules, checked on the tree: imports point one way (no cycle, function-level
imports included; product code imports nothing of the suites) and sit at the top of their
module unless they are of a kind docs/ARCHITECTURE.md names."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("engines", "harness", "reports")
NOT_READ = {"suites", "examples", "docs", ".git", ".venv", ".lockstep", "build", "dist"}
# imported inside functions: optional libraries, heavy or absent on a machine
OPTIONAL = {"torch", "transformers", "cupy", "cupyx", "onnxruntime_genai", "llama_cpp", "gguf",
            "tokenizers", "safetensors", "vllm"}
# modules whose imports of lockstep's own code may wait for the function that needs them:
# the CLI's commands (their machinery loads when the command runs), the pytest plugin (in
# every pytest session), the GPU pinning that must run before CUDA starts, the tensor ops
# an engine makes and the servers' engine classes, made only for an ``http`` spelling
# (ml_dtypes and onnx, which importing the registry should not load)
LAZY = ("harness/cli/", "harness/pytest_plugin.py", "harness/distributed.py")
LAZY_IMPORTS = {("engines/engine.py", "engines.tensor_ops.host"),
                ("engines/registry.py", "engines.backends.http.spelling")}


def _modules() -> dict[str, Path]:
    """Every Python module of the tree outside the suites, by dotted name."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if any(part in NOT_READ or part.startswith(".") for part in rel.parts[:-1]):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The dotted names ``path`` imports anywhere in it (a function's body included): a
    module where ``from package import name`` names one, else the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                out.add(sub if sub in modules else base)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for target in _imports(name, path, modules):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def test_no_module_imports_itself_through_others():
    try:
        graphlib.TopologicalSorter(_graph()).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_product_code_imports_nothing_of_the_suites():
    modules = _modules()
    offending = {name: sorted(t for t in _imports(name, path, modules)
                              if t.split(".")[0] in ("suites", "fixtures"))
                 for name, path in modules.items() if name.split(".")[0] in PRODUCT}
    assert not {k: v for k, v in offending.items() if v}


def _function_level_imports(path: Path):
    """(line, module) of each import inside a function of ``path``."""
    found = []

    def visit(node, inside: bool):
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif inside and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def test_imports_inside_functions_are_of_the_kept_kinds():
    misplaced = []
    for name, path in _modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if name.split(".")[0] not in PRODUCT:
            continue
        for line, module in _function_level_imports(path):
            if module.split(".")[0] in OPTIONAL or rel.startswith(LAZY) \
                    or (rel, module) in LAZY_IMPORTS:
                continue
            misplaced.append(f"{rel}:{line} {module}")
    assert not misplaced, "imports to move to the top of their module: " + ", ".join(misplaced)
