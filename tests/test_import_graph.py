"""The package's import graph, built from its sources: no module imports itself through others,
and the product (everything but the CLI and the benchmark packages) never imports the benchmark
stand-ins, the benches or the evaluations. Every import counts: at the top, inside functions, and
for type checking only."""

import ast
from pathlib import Path

import hsd_cli

PACKAGE = Path(hsd_cli.__file__).parent
BENCHMARK_PACKAGES = ("hsd_cli.replay", "hsd_cli.bench", "hsd_cli.eval")
# The CLI wires the benchmark commands in, and gives the page stage a replay model's page check.
NOT_PRODUCT = BENCHMARK_PACKAGES + ("hsd_cli.cli",)


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("hsd_cli",) + path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []
    prefix = ".".join(base + ([node.module] if node.module else []))
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a submodule's packages too: importing one runs them)."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_names(module, path, node):
                parts = name.split(".")
                for end in range(2, len(parts) + 1):
                    target = ".".join(parts[:end])
                    if target in modules and target != module and not module.startswith(target + "."):
                        graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def product_imports_of_benchmarks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (module, target)
        for module, targets in graph.items()
        if not module.startswith(NOT_PRODUCT)
        for target in targets
        if target.startswith(BENCHMARK_PACKAGES)
    )


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    assert {"hsd_cli.document.pipeline", "hsd_cli.stages.page_stage", "hsd_cli.decoding.loop", "hsd_cli.replay.build"} <= set(graph)
    assert "hsd_cli.config" in graph["hsd_cli.document.pipeline"], "the graph holds the imports"
    assert cycles(graph) == []


def test_the_product_does_not_import_the_benchmark_stand_ins_benches_or_evaluations():
    assert product_imports_of_benchmarks(import_graph()) == []


def test_a_cycle_or_a_benchmark_import_added_by_hand_is_found():
    graph = import_graph()
    graph["hsd_cli.config"].add("hsd_cli.document.pipeline")  # pipeline imports config
    assert any({"hsd_cli.config", "hsd_cli.document.pipeline"} <= set(group) for group in cycles(graph))
    graph = import_graph()
    graph["hsd_cli.stages.page_stage"].add("hsd_cli.replay.fingerprint")
    assert product_imports_of_benchmarks(graph) == [("hsd_cli.stages.page_stage", "hsd_cli.replay.fingerprint")]


# What the stages may import of the model runtime: its face (the Reader protocol), nothing inside.
SERVING_FACE = {"hsd_cli.serving", "hsd_cli.serving.reader"}


def stage_imports_of_serving_internals(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (module, target)
        for module, targets in graph.items()
        if module.startswith("hsd_cli.stages")
        for target in targets
        if target.startswith("hsd_cli.serving") and target not in SERVING_FACE
    )


def test_the_stages_call_the_model_runtime_through_its_reader_only():
    graph = import_graph()
    assert "hsd_cli.serving.reader" in graph["hsd_cli.stages.page_stage"], "the graph holds the stages' imports"
    assert stage_imports_of_serving_internals(graph) == []
    graph["hsd_cli.stages.region"].add("hsd_cli.serving.model")
    assert stage_imports_of_serving_internals(graph) == [("hsd_cli.stages.region", "hsd_cli.serving.model")]


def test_no_module_of_the_package_is_over_450_lines():
    long = {module: lines for module, path in _modules().items() if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}
