"""The layers as an import graph: no import circle anywhere in the tree — ``pipelines``, ``trainer``,
``eval``, the Airflow glue in ``plugins/`` (``taxiway_airflow``) and the DAG files in ``dags/`` —
in-function imports included (a circle held together by imports inside functions is still a circle);
``trainer`` imports neither ``pipelines`` nor ``eval``, ``eval`` imports nothing from ``pipelines``,
neither ``pipelines`` nor ``eval`` imports ``airflow``, and the callers of the stages (the CLI, the
Airflow glue, the DAG files) reach them through ``pipelines.stages`` only (docs/architecture.md, Layers).

The graph is read from the source with ``ast``, without importing anything: every ``import x`` and
``from x import y`` anywhere in a module (top level, functions, ``TYPE_CHECKING`` blocks) is an
edge; ``from pkg import mod`` is an edge to the submodule ``pkg.mod`` when there is one, else to
``pkg``. An import of ``a.b.c`` is an edge to ``a.b.c`` only: Python runs the packages above it
first, but a package's ``__init__`` re-exporting its own modules is not a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from conftest import REPO

LAYERS = ("pipelines", "trainer", "eval")
TREE = (*LAYERS, "plugins", "dags")  # plugins/ and dags/ are on Airflow's sys.path: their modules are top-level
ON_PATH = ("plugins", "dags")

Graph = dict[str, dict[str, str]]  # module → {imported module: "file:line" of its first import}


def module_files(root: Path, packages: Iterable[str] = LAYERS) -> dict[str, Path]:
    """Every module under the given top-level packages: dotted name → file."""
    out: dict[str, Path] = {}
    for package in packages:
        base = root / package if package in ON_PATH else root
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, modules: Mapping[str, Path], root: Path) -> dict[str, str]:
    """What module ``name`` (at ``path``) imports, each with where: {module: "file:line"}."""
    is_package = path.name == "__init__.py"
    out: dict[str, str] = {}

    def add(target: str, node: ast.AST) -> None:
        out.setdefault(target, f"{path.relative_to(root)}:{node.lineno}")

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, one level up per extra dot
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node)
    out.pop(name, None)
    return out


def import_graph(root: Path = REPO, packages: Iterable[str] = LAYERS) -> Graph:
    modules = module_files(root, packages)
    return {name: imports_of(name, path, modules, root) for name, path in modules.items()}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """An import circle as a path ``[a, b, …, a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # absent: unseen, 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _within(graph: Graph, prefix: str) -> dict[str, dict[str, str]]:
    return {m: {t: w for t, w in deps.items() if _under(t, prefix)} for m, deps in graph.items() if _under(m, prefix)}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _circle_message(graph: Graph, cycle: list[str]) -> str:
    steps = "\n".join(f"  {a} → {b}   ({graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False))
    return (f"import circle: {' → '.join(cycle)}\n{steps}\n"
            "break it by moving what both need into a module below both (imports go one way only)")


def _forbidden(graph: Graph, importer: str, banned: tuple[str, ...]) -> list[str]:
    return [f"  {m} imports {t}   ({where})" for m, deps in sorted(graph.items()) if _under(m, importer)
            for t, where in sorted(deps.items()) if any(_under(t, b) for b in banned)]


GRAPH = import_graph(REPO, TREE)


def test_the_graph_sees_every_layer_and_in_function_imports():
    """A walker that found nothing would pass every check below."""
    for package in (*LAYERS, "taxiway_airflow"):
        assert sum(_under(m, package) for m in GRAPH) >= 5, f"{package}: too few modules found in {REPO}"
    assert {"taxiway_train", "taxiway_refresh", "taxiway_land", "taxiway_sweep"} <= set(GRAPH), "the DAG files"
    assert "pipelines.registry" in GRAPH["pipelines.stages.train"], "top-level from-imports of a package"
    assert "eval.gate" in GRAPH["pipelines.stages.evaluate"], "evaluate imports eval inside run()"
    assert "pipelines.registry.client" in GRAPH["pipelines.registry.champion"], "from-imports of a submodule"
    assert "taxiway_airflow.operators.kubernetes" in GRAPH["taxiway_airflow.stage_groups"], "plugins/ on the path"


def test_no_import_circle_anywhere_in_the_tree():
    inner = {m: {t: w for t, w in deps.items() if t in GRAPH} for m, deps in GRAPH.items()}
    cycle = find_cycle(inner)
    assert cycle is None, _circle_message(inner, cycle)


REGISTRY_ORDER = ("hf_pyfunc", "served", "client", "locks", "metrics", "lineage", "runs", "champion", "approval", "sweep")  # pipelines/registry/__init__.py


def test_registry_modules_import_only_those_below_them():
    """Each registry module may import only modules listed before it — never the package's
    ``__init__`` (which re-exports them all) nor the stages that call it."""
    modules = {m.removeprefix("pipelines.registry.") for m in GRAPH if m.startswith("pipelines.registry.")}
    assert modules == set(REGISTRY_ORDER), f"pipelines/registry/ holds {sorted(modules)}; update REGISTRY_ORDER"
    bad = []
    for i, module in enumerate(REGISTRY_ORDER):
        allowed = {f"pipelines.registry.{m}" for m in REGISTRY_ORDER[:i]}
        for target, where in sorted(GRAPH[f"pipelines.registry.{module}"].items()):
            if (_under(target, "pipelines.registry") and target not in allowed) or _under(target, "pipelines.stages"):
                bad.append(f"  pipelines.registry.{module} imports {target}   ({where})")
    assert not bad, (f"each registry module may import only those listed before it ({', '.join(REGISTRY_ORDER)}):\n"
                     + "\n".join(bad))


def test_trainer_imports_neither_pipelines_nor_eval():
    bad = _forbidden(GRAPH, "trainer", ("pipelines", "eval"))
    assert not bad, "trainer/ is the bottom layer; it must not import pipelines or eval:\n" + "\n".join(bad)


def test_pipelines_and_eval_never_import_airflow():
    bad = _forbidden(GRAPH, "pipelines", ("airflow",)) + _forbidden(GRAPH, "eval", ("airflow",))
    assert not bad, ("pipelines/ and eval/ run outside Airflow (CLI, pods, tests); only plugins/ and dags/ "
                     "may import airflow:\n" + "\n".join(bad))


def test_eval_imports_nothing_from_pipelines():
    bad = _forbidden(GRAPH, "eval", ("pipelines",))
    assert not bad, "eval/ sits below pipelines/ (it may use trainer/ only):\n" + "\n".join(bad)


# --- the checks can fail -----------------------------------------------------------------------------

def test_find_cycle_reports_a_planted_circle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    assert find_cycle({}) is None


def test_a_circle_through_an_in_function_and_a_relative_import_is_found(tmp_path: Path):
    pkg = tmp_path / "pipelines"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .low import x\n")
    (pkg / "sub" / "low.py").write_text("x = 1\n\ndef late():\n    from pipelines import high\n    return high\n")
    (pkg / "high.py").write_text("from pipelines.sub import low\nimport airflow.models\n")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "loop.py").write_text("def f():\n    import pipelines.high\n")
    graph = import_graph(tmp_path, ("pipelines", "trainer"))
    assert graph["pipelines.sub"] == {"pipelines.sub.low": "pipelines/sub/__init__.py:1"}
    assert set(graph["pipelines.high"]) == {"pipelines.sub.low", "airflow.models"}
    cycle = find_cycle(_within(graph, "pipelines"))
    assert cycle == ["pipelines.high", "pipelines.sub.low", "pipelines.high"]
    message = _circle_message(graph, cycle)
    assert "pipelines.sub.low → pipelines.high   (pipelines/sub/low.py:4)" in message
    assert _forbidden(graph, "pipelines", ("airflow",)) == [
        "  pipelines.high imports airflow.models   (pipelines/high.py:2)"]
    assert _forbidden(graph, "trainer", ("pipelines", "eval")) == [
        "  trainer.loop imports pipelines.high   (trainer/loop.py:2)"]


# the launchers (``pipelines.launch``) are held by the operators, the trigger and the CLI; a local node's
# wrapper process is the local launcher's own
STAGE_INTERNALS = ("pipelines.launch.node", "pipelines.preflight", "pipelines.tokenize")
STAGE_CALLERS = ("taxiway_airflow", "taxiway_plugin", "taxiway_train", "taxiway_refresh", "taxiway_land", "taxiway_sweep",
                 "pipelines.cli", "pipelines.sweep")


def test_the_stages_callers_reach_stage_internals_only_through_pipelines_stages():
    """The CLI, the sweep, the Airflow glue and the DAG files call ``pipelines.stages`` (and hold a launcher
    of ``pipelines.launch``); the stages' internals (the preflight checks, the tokenizer and packer) are
    theirs alone."""
    bad = [line for caller in STAGE_CALLERS for line in _forbidden(GRAPH, caller, STAGE_INTERNALS)]
    assert not bad, "import the stage (pipelines.stages.<stage>) instead:\n" + "\n".join(bad)


def _late_import_blocks(path: Path) -> list[tuple[int, int]]:
    """(first line, last line) of each run of consecutive import statements inside a function."""
    blocks: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for body in [node.body] + [n.body for n in ast.walk(node) if n is not node and hasattr(n, "body")
                                   and isinstance(n.body, list) and not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]:
            run: list[ast.stmt] = []
            for stmt in [*body, None]:
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    run.append(stmt)
                elif run:
                    blocks.append((run[0].lineno, run[-1].end_lineno or run[-1].lineno))
                    run = []
    return sorted(set(blocks))


def test_an_import_inside_a_function_says_why_it_is_not_at_the_top():
    """Imports sit at the top of a module, so its dependencies read from its head; one kept inside a
    function (heavy, or off a path that must stay light: a DAG file's parse, a process's start) says
    why in a comment on its block or the line above it."""
    bad = []
    for path in module_files(REPO, TREE).values():
        lines = path.read_text().splitlines()
        for first, last in _late_import_blocks(path):
            if not any("#" in lines[i - 1] for i in range(max(first - 1, 1), last + 1)):
                bad.append(f"  {path.relative_to(REPO)}:{first}: {lines[first - 1].strip()}")
    assert not bad, "move these imports to the top, or say in a comment why they wait:\n" + "\n".join(bad)


def test_a_late_import_without_a_reason_is_found(tmp_path: Path):
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    import json\n    return json\n\n\ndef g():\n"
                                   "    # torch: heavy\n    import torch\n    from torch import nn\n    return nn\n")
    assert _late_import_blocks(tmp_path / "m.py") == [(5, 5), (11, 12)]
