"""The house's layout, checked: pyshim's packages import in the order of the data's way (pyshim.LAYERS) and
never in a cycle, only two modules touch the browser's FFI, every package says what it holds and may
import, no module grows past ~500 lines; the page's ES modules import in no cycle either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pyshim

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyshim"
MAX_LINES = 520


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every pyshim module `path` imports, at the top or inside a function."""
    def resolve(name: str) -> str:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("pyshim")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyshim"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in known else resolve(node.module))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> int:
    stage = module.split(".")[1] if "." in module else "errors"
    return pyshim.LAYERS.index(stage)


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_imports_follow_the_stages():
    upward = [f"{m} -> {o}" for m, out in graph().items() for o in out if layer(o) > layer(m)]
    assert upward == [], "a stage imports a later one (pyshim/__init__.py lists the order)"


def test_only_two_modules_touch_the_browser_ffi():
    touching = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "js" or n.startswith(("js.", "pyodide")) for n in names):
                touching.add(name)
    assert touching == set(pyshim.JS_INTEROP)


def test_every_package_says_what_it_holds_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import:" in doc, init
    for stage in pyshim.LAYERS:
        assert (PACKAGE / stage).is_dir() or (PACKAGE / f"{stage}.py").is_file(), stage


def test_no_module_is_a_small_book():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


JS_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'"`;]*?\bfrom\s*['"]([^'"]+)['"]|^\s*import\s*['"]([^'"]+)['"]""", re.M)


def test_the_page_modules_import_in_no_cycle():
    web = ROOT / "web"
    edges = {}
    for path in web.rglob("*.js"):
        if "vendor" in path.relative_to(web).parts:
            continue
        deps = set()
        for m in JS_IMPORT.finditer(path.read_text()):
            spec = m.group(1) or m.group(2)
            if spec.startswith("."):
                target = (path.parent / spec).resolve()
                if "vendor" not in target.relative_to(web.resolve()).parts:
                    deps.add(str(target.relative_to(web.resolve())))
        edges[str(path.relative_to(web))] = deps
    assert len(edges) > 20
    assert cycles(edges) == []
