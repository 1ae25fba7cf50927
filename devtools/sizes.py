"""The package's sizes against the house rules (issue 49): no hand-written module over
``MAX_MODULE_LINES`` lines, no function over ``MAX_FUNCTION_LINES`` lines or
``MAX_PARAMS`` parameters (``self``/``cls`` not counted; ``*args``/``**kwargs`` count one each).
Generated code (protobuf/gRPC stubs: ``*_pb2.py``, ``*_pb2_grpc.py``) is left out.

Run ``python -m devtools.sizes`` to print every breach (exit 1 when there is one), or
``python -m devtools.sizes --all`` for the largest modules and functions too. Read with ``ast``
from the sources; nothing is imported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMS = 6
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "omaticaya_py"


@dataclass(frozen=True)
class Breach:
    """One breach: ``where`` (``path`` or ``path:line name``), ``what`` (``lines``/``params``),
    ``size`` and the ``limit`` it is over."""

    where: str
    what: str
    size: int
    limit: int

    def __str__(self) -> str:
        return f"{self.where}: {self.size} {self.what} (at most {self.limit})"


def generated(path: Path) -> bool:
    """Whether ``path`` is generated code (protobuf and gRPC stubs)."""
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))


def modules(root: Path = PACKAGE) -> list[Path]:
    """The hand-written ``.py`` files under ``root``, sorted."""
    return sorted(p for p in root.rglob("*.py") if not generated(p))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def measure(path: Path) -> tuple[int, list[tuple[str, int, int]]]:
    """``(lines of the module, [(qualified name at line, lines, parameters)] per function)``."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    out: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lines = (child.end_lineno or child.lineno) - start + 1
                name = f"{prefix}{child.name}"
                out.append((f"{child.lineno} {name}", lines, _params(child)))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return len(text.splitlines()), out


def breaches(root: Path = PACKAGE) -> list[Breach]:
    """Every breach of the house rules under ``root``, module by module."""
    found: list[Breach] = []
    for path in modules(root):
        rel = path.relative_to(ROOT)
        lines, functions = measure(path)
        if lines > MAX_MODULE_LINES:
            found.append(Breach(str(rel), "lines", lines, MAX_MODULE_LINES))
        for where, fn_lines, params in functions:
            if fn_lines > MAX_FUNCTION_LINES:
                found.append(Breach(f"{rel}:{where}", "lines", fn_lines, MAX_FUNCTION_LINES))
            if params > MAX_PARAMS:
                found.append(Breach(f"{rel}:{where}", "params", params, MAX_PARAMS))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also the 15 largest modules")
    args = parser.parse_args(argv)
    found = breaches()
    for b in found:
        print(b)
    if args.all:
        sizes = sorted(((measure(p)[0], p.relative_to(ROOT)) for p in modules()), reverse=True)
        for lines, rel in sizes[:15]:
            print(f"{lines:5d} {rel}")
    total = len(modules())
    print(f"{len(found)} breach(es) in {total} modules", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
