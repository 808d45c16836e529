"""The daemon's layout as docs/architecture.md states it: no two modules of `supervisor`
import each other (type-only imports count: they are how cycles start), and each room of
`supervisor/daemon/` imports only the rooms its row of the table names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import supervisor

ROOT = Path(supervisor.__file__).parent
ROOMS = ("store", "requests", "running", "watch", "life")
# room -> the rooms it may import; (room, module) pairs name the one module of a room
# that another may reach.
MAY_IMPORT: dict[str, set[str]] = {
    "root": {"root", "store"},
    "store": {"root", "store"},
    "requests": {"root", "store", "requests", "watch", "running/runner"},
    "running": {"root", "store", "running", "watch"},
    "watch": {"root", "store", "watch", "running/runner"},
    "life": {"root", *ROOMS},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("supervisor", *path.relative_to(ROOT).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{up}.{base}" if base else up
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:
                        graph[name].add(target)
                    elif base in modules:
                        graph[name].add(base)
    return graph


GRAPH = _imports(_modules())


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["supervisor", "daemon"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in ROOMS else "root"


def test_the_graph_is_read() -> None:
    # The check below is only as good as the graph: a known edge must be in it.
    assert "supervisor.daemon.engine" in GRAPH["supervisor.daemon.dispatcher"]
    assert "supervisor.daemon.running.runner" in GRAPH["supervisor.daemon.life.app"]


def test_no_two_modules_import_each_other() -> None:
    pairs = sorted((a, b) for a in GRAPH for b in GRAPH[a] if a < b and a in GRAPH[b])
    assert pairs == []


@pytest.mark.parametrize("room", ["root", *ROOMS])
def test_each_room_imports_what_the_architecture_allows(room: str) -> None:
    allowed = MAY_IMPORT[room]
    wrong = []
    for module, targets in GRAPH.items():
        if _room(module) != room:
            continue
        for target in targets:
            there = _room(target)
            if there is None or there in allowed:
                continue
            if f"{there}/{target.rsplit('.', 1)[-1]}" not in allowed:
                wrong.append(f"{module} -> {target}")
    assert sorted(wrong) == []


def test_nothing_outside_the_daemon_imports_it() -> None:
    # The CLI, the keeper and the core stay importable without the daemon's packages.
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _room(module) is None
        for target in targets
        if _room(target) is not None
    ]
    assert sorted(wrong) == []


def test_no_module_is_over_400_lines() -> None:
    # One concept a module: past this, a module has become two and wants a split.
    long = {
        str(path.relative_to(ROOT)): n
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 400
    }
    assert long == {}
