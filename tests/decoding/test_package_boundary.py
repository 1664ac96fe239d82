"""`hsd_cli.decoding` is a library of its own: it imports nothing else from hsd_cli."""

import ast
from pathlib import Path

import hsd_cli.decoding

PACKAGE = "hsd_cli.decoding"


def outside_imports(source: str, module: str) -> list[str]:
    """The imports of `module` (a dotted name inside PACKAGE) that reach other hsd_cli modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            # Relative: resolved against the module's package, as Python resolves it.
            base = module.split(".")[: -node.level]
            names = [".".join(base + ([node.module] if node.module else []))]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] == "hsd_cli" and not (n == PACKAGE or n.startswith(PACKAGE + "."))]
    return found


def test_decoding_imports_nothing_else_from_the_package():
    root = Path(hsd_cli.decoding.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 5
    leaks = {}
    for path in modules:
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join([PACKAGE, *parts]) if parts != ("__init__",) else PACKAGE + ".__init__"
        leaks[path.name] = outside_imports(path.read_text(encoding="utf-8"), module)
    assert not any(leaks.values()), {name: found for name, found in leaks.items() if found}


def test_the_check_sees_absolute_and_relative_imports_that_leave():
    module = f"{PACKAGE}.loop"
    leaving = "from hsd_cli.models.tiny import build_tiny_random\nfrom ..stages import vlm\nimport hsd_cli.document.pipeline\nfrom .. import cli\n"
    assert outside_imports(leaving, module) == ["hsd_cli.models.tiny", "hsd_cli.stages", "hsd_cli.document.pipeline", "hsd_cli"]
    staying = "from .tree import TokenTree\nfrom hsd_cli.decoding.verify import keyed_sample\nimport torch\n"
    assert outside_imports(staying, module) == []


def test_only_the_target_package_imports_transformers():
    """Proposers, trees, verification and the loop are plain data and tensors; everything that
    knows transformers (families, the cache, generate) is in `hsd_cli.decoding.hf_target`."""
    root = Path(hsd_cli.decoding.__file__).parent
    knowing = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) else []
            if any(name and name.split(".")[0] == "transformers" for name in names):
                knowing.add(path.relative_to(root).parts[0])
    assert knowing == {"hf_target"}
