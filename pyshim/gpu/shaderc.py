"""WGSL sources → one expanded module per kernel variant: a tiny preprocessor and a pipeline key.

The shaders live in `shaders/<family>.wgsl` with shared code in `shaders/include/`. A variant is the
family plus a set of defines (`W_Q4_K`, `WG=64`, ...); the preprocessor understands, one per line:

    #include "include/x.wgsl"     paste that file here (relative to the shader root; once per module)
    #define NAME value            replace the word NAME by `value` in the lines below (value may be empty)
    #ifdef NAME / #ifndef NAME / #else / #endif
    #unroll NAME COUNT / #endunroll
                                  the plain lines between, COUNT times (COUNT: a number or a define), the word
                                  NAME replaced by 0u, 1u, ... in each copy: constant indices where a loop's
                                  counter would index per lane (SwiftShader keeps such arrays in memory);
                                  an #unroll may stand inside another
    #enable NAME                  the WGSL extension NAME: `enable NAME;` heads the module, unless the target
                                  compiler enables NAME by itself and rejects the line (IMPLICIT_ENABLES)

Defines given by the caller are applied the same way as `#define` lines. Malformed input (an unknown
directive, an unterminated `#if`, a stray `#else`/`#endif`, a missing include, an include cycle) raises
ShaderError naming the file and line. Sources come from a mapping {relative path: text}, so the same code
runs in CPython and in Pyodide (both read `pyshim.paths.shaders_dir()` by default, or take a mapping).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from pyshim.errors import ShaderError
from pyshim.paths import shaders_dir
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_INCLUDE = re.compile(r'^#include\s+"([^"]+)"\s*$')
_DEFINE = re.compile(r"^#define\s+([A-Za-z_][A-Za-z0-9_]*)(?:\s+(.*?))?\s*$")
_COND = re.compile(r"^#(ifdef|ifndef)\s+([A-Za-z_][A-Za-z0-9_]*)\s*$")
_ENABLE = re.compile(r"^#enable\s+([A-Za-z_][A-Za-z0-9_]*)\s*$")
_UNROLL = re.compile(r"^#unroll\s+([A-Za-z_][A-Za-z0-9_]*)\s+([A-Za-z0-9_]+)\s*$")
# WGSL compilers -> the extensions each turns on by itself and rejects an `enable` line for. naga (wgpu-py
# 0.32) answers `enable subgroups;` with "the `subgroups` enable-extension is not yet supported" yet compiles
# the subgroup builtins once the device has its 'subgroup' feature; Tint (Chromium) requires the line.
IMPLICIT_ENABLES = {"tint": frozenset(), "naga": frozenset({"subgroups"})}


def load_sources(root: str | Path | None = None) -> dict[str, str]:
    """Every `.wgsl` under `root` (default: `pyshim.paths.shaders_dir()`, the checkout's `shaders/` or the
    wheel's copy), keyed by its path relative to root (POSIX separators)."""
    root = Path(root) if root is not None else shaders_dir()
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.wgsl"))}


@dataclass(frozen=True)
class ShaderKey:
    """Which pipeline: a shader family and its defines. Hashable (the pipeline cache's key) and readable.

    `defines` is a sorted tuple of (name, value) pairs; a flag define has value "" ."""

    family: str
    defines: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, family: str, **defines) -> "ShaderKey":
        """ShaderKey.of("matvec", W_Q4_K=True, WG=64): True gives a flag define, False/None leave it out."""
        items = []
        for name, value in defines.items():
            if value is None or value is False:
                continue
            items.append((name, "" if value is True else str(value)))
        return cls(family, tuple(sorted(items)))

    @property
    def label(self) -> str:
        """e.g. `matvec_q4_k_bias_wg64`: the family, the weight type (W_* without its prefix), the other
        flags, then name+value pairs."""
        order = sorted(self.defines, key=lambda d: (not d[0].startswith("W_"), d[1] != "", d[0]))
        parts = [self.family]
        for name, value in order:
            word = name[2:] if name.startswith("W_") else name
            parts.append(word.lower() + (value.lower().replace(".", "p").replace("-", "m") if value else ""))
        return "_".join(parts)


class Preprocessor:
    def __init__(self, sources: Mapping[str, str] | None = None, compiler: str = "tint"):
        """`compiler`: "tint" (browsers) or "naga" (wgpu): which `enable` lines the modules get."""
        if compiler not in IMPLICIT_ENABLES:
            raise ValueError(f"unknown WGSL compiler {compiler!r}")
        self.sources = dict(sources) if sources is not None else load_sources()
        self.implicit = IMPLICIT_ENABLES[compiler]

    def expand(self, path: str, defines: Mapping[str, str] | None = None) -> str:
        """The expanded source of `path` (e.g. "matvec.wgsl") under `defines`."""
        table = dict(defines or {})
        out: list[str] = []
        enables: list[str] = []
        self._expand(path, table, out, enables, stack=(), included=set())
        # WGSL wants enable directives before any declaration, wherever the #enable stood
        head = [f"enable {name};" for name in dict.fromkeys(enables) if name not in self.implicit]
        return "\n".join(head + out) + "\n"

    def build(self, key: ShaderKey) -> str:
        return self.expand(f"{key.family}.wgsl", dict(key.defines))

    def _expand(self, path: str, table: dict[str, str], out: list[str], enables: list[str], stack: tuple[str, ...],
                included: set[str]) -> None:
        if path in stack:
            raise ShaderError(f"include cycle: {' -> '.join(stack + (path,))}")
        if path not in self.sources:
            where = f" (included from {stack[-1]})" if stack else ""
            raise ShaderError(f"unknown shader file {path!r}{where}")
        included.add(path)
        # conditions: one (active, seen_else, line) per open #if; a line is emitted when all are active
        conds: list[list] = []
        unroll: tuple[str, str, str] | None = None      # (NAME, COUNT, where) of an open #unroll
        body: list[tuple[str, str]] = []                 # its lines (where, line), nested #unrolls included
        depth = 0
        for lineno, line in enumerate(self.sources[path].splitlines(), 1):
            stripped = line.strip()
            active = all(c[0] for c in conds)
            where = f"{path}:{lineno}"
            if unroll is not None:
                if stripped.startswith("#") and not _UNROLL.match(stripped) and stripped != "#endunroll":
                    raise ShaderError(f"{where}: only plain lines and #unroll may stand inside #unroll ({unroll[2]})")
                depth = _nesting(stripped, depth)
                if depth is None:
                    out.extend(_unrolled(unroll, body, table))
                    unroll, body, depth = None, [], 0
                else:
                    body.append((where, line))
                continue
            if not stripped.startswith("#"):
                if active:
                    out.append(_substitute(line, table))
                continue
            if m := _UNROLL.match(stripped):
                # (inside an inactive #ifdef the body is read and dropped)
                unroll = (m.group(1), m.group(2) if active else "0", where)
                continue
            if stripped == "#endunroll":
                raise ShaderError(f"{where}: #endunroll without #unroll")
            if m := _COND.match(stripped):
                conds.append([(m.group(2) in table) == (m.group(1) == "ifdef"), False, where])
            elif stripped == "#else" or stripped.startswith("#else "):
                if not conds or conds[-1][1]:
                    raise ShaderError(f"{where}: #else without a matching #ifdef/#ifndef")
                conds[-1][0], conds[-1][1] = not conds[-1][0], True
            elif stripped == "#endif" or stripped.startswith("#endif "):
                if not conds:
                    raise ShaderError(f"{where}: #endif without a matching #ifdef/#ifndef")
                conds.pop()
            elif not active:
                if not stripped.startswith(("#include", "#define", "#enable")):
                    raise ShaderError(f"{where}: unknown directive {stripped.split()[0]!r}")
            elif m := _INCLUDE.match(stripped):
                target = m.group(1)
                if target in stack or target == path:
                    raise ShaderError(f"{where}: include cycle: {' -> '.join(stack + (path, target))}")
                if target not in included:       # each file once per module (WGSL has no redefinition)
                    self._expand(target, table, out, enables, stack + (path,), included)
            elif m := _DEFINE.match(stripped):
                table[m.group(1)] = _substitute(m.group(2) or "", table)
            elif m := _ENABLE.match(stripped):
                enables.append(m.group(1))
            else:
                raise ShaderError(f"{where}: malformed or unknown directive {stripped!r}")
        if unroll is not None:
            raise ShaderError(f"{unroll[2]}: #unroll is never closed by #endunroll")
        if conds:
            raise ShaderError(f"{conds[-1][2]}: #if... is never closed by #endif")


def _unrolled(unroll: tuple[str, str, str], body: list[tuple[str, str]], table: Mapping[str, str]) -> list[str]:
    """An #unroll's body COUNT times, NAME as 0u, 1u, ... in each copy; a nested #unroll within it expanded
    in each copy (its count may name the outer NAME's defines, not NAME)."""
    name, count_word, where = unroll
    count = _substitute(count_word, table)
    if not count.isdigit():
        raise ShaderError(f"{where}: #unroll's count {count_word!r} is not a number ({count!r})")
    out: list[str] = []
    for i in range(int(count)):
        copy = {**table, name: f"{i}u"}
        inner: tuple[str, str, str] | None = None
        lines: list[tuple[str, str]] = []
        depth = 0
        for at, line in body:
            stripped = line.strip()
            if inner is None:
                if m := _UNROLL.match(stripped):
                    inner, lines, depth = (m.group(1), m.group(2), at), [], 0
                else:
                    out.append(_substitute(line, copy))
                continue
            depth = _nesting(stripped, depth)
            if depth is None:
                out.extend(_unrolled(inner, lines, copy))
                inner = None
            else:
                lines.append((at, line))
    return out


def _nesting(stripped: str, depth: int) -> int | None:
    """Inside an #unroll's body with `depth` nested #unrolls open: None when line `stripped` closes the
    body, else the nested #unrolls open after it."""
    if stripped == "#endunroll":
        return None if depth == 0 else depth - 1
    return depth + 1 if _UNROLL.match(stripped) else depth


def _substitute(line: str, table: Mapping[str, str]) -> str:
    if not table:
        return line
    return _WORD.sub(lambda m: table.get(m.group(0), m.group(0)), line)
