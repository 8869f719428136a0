"""Imports go one way: no module of the apps imports one that (through any chain) imports it back, and no app
imports one in a layer above its own. Every module is read with `ast`, so an import inside a function counts too
(that is where a circle used to hide: "imported here, the other module imports this one").

The layers, bottom to top, as the code is built:

1. `controlplane`: settings, Redis and HTTP clients, probes; it knows no product (the URL conf and the Celery app
   name the apps by string, and /metrics learns what to count from the apps that register a collector).
2. `deployments`: the domain (models, state machine, services, permissions, selectors, API).
3. `gateway`, `usage`, `workers`, `observability`: what runs the domain; they may import each other (the
   reconciler asks for a conformance run, which probes through the workers' cluster targets and reads the
   request records' usage), as long as no circle forms between their modules.
4. `frontend`: the portal, which may read anything below it.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [{"controlplane"}, {"deployments"}, {"gateway", "usage", "workers", "observability"}, {"frontend"}]
LAYER_OF = {app: level for level, apps in enumerate(LAYERS) for app in apps}


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


def imported_names(tree: ast.AST, *, package: str) -> list[tuple[int, str]]:
    """(line, module.name) for every `from module import name`, relative ones resolved against `package` (the
    importing module's): the name may be a module of its own, which the graph decides."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _our_modules() -> dict[str, Path]:
    modules = {}
    for app in LAYER_OF:
        for path in (ROOT / app).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, dict[str, int]]:
    """{module: {module of ours it imports: line}}; a name imported from a module counts as that module."""
    modules = _our_modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target in imported_modules(tree) + imported_names(tree, package=package):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each group of modules that import one another through some chain (Tarjan's strongly connected components
    of more than one module), sorted."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module in a higher layer than the importer's, as `importer:line imports module`."""
    def layer(module):
        return LAYER_OF[module.split(".")[0]]

    return sorted(f"{module}:{line} imports {target}" for module, edges in graph.items()
                  for target, line in edges.items() if layer(target) > layer(module))


def test_no_module_imports_itself_back_through_others():
    assert import_circles(import_graph()) == []


def test_no_app_imports_one_above_its_layer():
    assert upward_imports(import_graph()) == []


def test_template_tags_import_nothing_that_reads_the_database():
    """A template tag formats what its view put in the context; one that reads (a selector, a service, a model)
    runs its queries on every page that includes it, unseen by the view's query count."""
    assert {module: sorted(edges) for module, edges in import_graph().items()
            if module.startswith("frontend.templatetags.")
            and any(not target.startswith("frontend.") for target in edges)} == {}


def test_the_walk_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from workers.tasks import reconcile_deployment\n"
                     "    import gateway.store\n    importlib.import_module('observability.tasks')\n")
    assert [m for _, m in imported_modules(tree)] == ["workers.tasks", "gateway.store", "observability.tasks"]


def test_names_imported_from_a_module_are_seen_and_relative_imports_resolved():
    tree = ast.parse("from . import spec\ndef f():\n    from ..errors import NotAllowed\n"
                     "    from workers.tasks import reconcile_deployment\n")
    assert [m for _, m in imported_names(tree, package="deployments.services")] == [
        "deployments.services.spec", "deployments.errors.NotAllowed", "workers.tasks.reconcile_deployment"]


def test_a_circle_is_found_however_long_and_a_chain_is_not():
    graph = {"deployments.a": {"deployments.b": 1}, "deployments.b": {"deployments.c": 3},
             "deployments.c": {"deployments.a": 7}, "deployments.d": {"deployments.a": 2}}
    assert import_circles(graph) == [["deployments.a", "deployments.b", "deployments.c"]]
    del graph["deployments.c"]["deployments.a"]
    assert import_circles(graph) == []


def test_an_import_up_a_layer_is_found_and_one_down_or_across_is_not():
    graph = {"controlplane.health": {"deployments.models": 72}, "deployments.selectors": {"controlplane.redis_client": 5},
             "workers.pipeline": {"observability.tasks": 23}, "observability.planner": {"frontend.planning": 9}}
    assert upward_imports(graph) == ["controlplane.health:72 imports deployments.models",
                                     "observability.planner:9 imports frontend.planning"]


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
