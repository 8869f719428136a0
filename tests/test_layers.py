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


# The gateway's request path runs as its own process without django.setup(): it reads PostgreSQL through its own
# pool and writes request records to Redis. The usage app (request records in PostgreSQL, the drain, usage and cost
# reads) is the Django side of it; the two share only the stream's name (controlplane/record_stream.py).
ORM = ("django.db", "django.apps")


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The project file that `module` names (a module or a package), or None for a module from outside."""
    base = root.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def is_models(module: str) -> bool:
    return "models" in module.split(".")


def reached_from(package: str, root: Path = ROOT) -> dict[str, str]:
    """Every project module that loading `package` can import, each with the module that first imports it.
    `from pkg import name` counts `pkg.name` when that is a module of its own, and `django.setup()` counts as
    importing django.apps (it loads every installed app's models)."""
    modules = [".".join(p.relative_to(root).with_suffix("").parts) for p in sorted((root / package).rglob("*.py"))]
    reached, todo = {m: "" for m in modules}, list(modules)
    while todo:
        name = todo.pop()
        path = module_file(name.removesuffix(".__init__"), root)
        tree = ast.parse(path.read_text(), filename=str(path))
        found = [m for _, m in imported_modules(tree)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [f"{node.module}.{alias.name}" for alias in node.names
                          if module_file(f"{node.module}.{alias.name}", root)]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "django.setup":
                found.append("django.apps")
        for module in found:
            if module not in reached and (module_file(module, root) or module.startswith(ORM)):
                reached[module] = name
                if module_file(module, root):
                    todo.append(module)
    return reached


def request_path_problems(root: Path = ROOT) -> list[str]:
    """What the gateway's process must not load: the usage app, a models module, or the ORM of its own accord."""
    bad = []
    for module, by in sorted(reached_from("gateway", root).items()):
        if module.split(".")[0] == "usage" or (is_models(module) and module_file(module, root)) \
                or (module.startswith(ORM) and by.split(".")[0] == "gateway"):
            bad.append(f"{by} imports {module}" if by else f"{module} is part of the gateway")
    return bad


def test_the_gateways_request_path_loads_neither_the_usage_app_nor_a_model():
    assert request_path_problems() == []


def test_the_usage_app_does_not_import_the_gateway():
    bad = [f"{by} imports {module}" for module, by in sorted(reached_from("usage").items())
           if module.split(".")[0] == "gateway"]
    assert bad == []


def test_the_request_path_walk_follows_imports_into_other_packages(tmp_path):
    files = {"gateway/__init__.py": "", "gateway/app.py": "from gateway import route\n",
             "gateway/route.py": "def f():\n    from shop.prices import price\n",
             "gateway/__main__.py": "import django\ndjango.setup()\n",
             "shop/__init__.py": "", "shop/prices.py": "from shop.models import Price\n",
             "shop/models.py": "from django.db import models\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert request_path_problems(tmp_path) == ["gateway.__main__ imports django.apps",
                                               "shop.prices imports shop.models"]
