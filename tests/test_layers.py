"""The domain imports nothing above it: `deployments` never imports the workers, the gateway, observability or
the portal (they import it). Every module is read with `ast`, so an import inside a function counts too."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABOVE_THE_DOMAIN = {"workers", "gateway", "observability", "frontend"}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import statement and every import_module("...")/__import__("...") call."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def upward_imports(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported_modules(tree):
            if module.split(".")[0] in ABOVE_THE_DOMAIN:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_deployments_imports_nothing_above_it():
    assert upward_imports("deployments") == []


def test_the_walk_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from workers.tasks import reconcile_deployment\n"
                     "    import gateway.store\n    importlib.import_module('observability.tasks')\n")
    assert [m for _, m in imported_modules(tree)] == ["workers.tasks", "gateway.store", "observability.tasks"]
