"""Which Kubernetes API requests the code makes, read from the code (a static scan).

Every request to the API server goes through ``omaticaya_py.kube.session.ApiSession.http(method,
path, ...)`` (the only place that talks HTTP to it). ``scan`` finds every ``.http(...)`` call
under ``omaticaya_py/`` with ``ast``, works out its method and path where they are literals, and
where they are parameters follows the callers (in the same package) until they are; a path that
is ``self.<attribute>`` is each value any class of the hierarchy assigns to it (an informer's
``path``). Each request becomes the RBAC permissions the API server checks for it (``access``:
the verb from the method and the path, the API group and resource from the path); each is named
by its *entry*: the outermost function of its package on the way (``kube.node_client.NodeClient.
get_node``), or, for a path taken from an attribute, the class that assigned it
(``kube.node_cache.NodeCache``). Which component calls which entry, and when, is the test's
table (tests/charts/test_chart_rbac_code.py); the verbs and resources are never written by hand.

A call whose method or path cannot be worked out raises ``ScanError`` naming the file and line:
a request the scan cannot see would be a permission nobody checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Access", "Request", "ScanError", "access", "scan"]

#: the content type of a server-side apply (a PATCH that creates the object when it is missing)
APPLY = "application/apply-patch+yaml"


class ScanError(Exception):
    """A ``.http(...)`` call whose method or path the scan cannot work out (file:line, why)."""


@dataclass(frozen=True, order=True)
class Access:
    """One permission as RBAC names it: API ``group`` (``""`` for core), ``resource`` (with
    its subresource: ``pods/eviction``), ``verb``; ``namespaced``: whether the path is under
    ``/namespaces/{namespace}/`` (a Role can grant it) or cluster-scoped (a ClusterRole must)."""

    group: str
    resource: str
    verb: str
    namespaced: bool


@dataclass(frozen=True)
class Request:
    """One request the code can make: ``entry`` (see the module), ``method`` and ``path``
    (a template: ``{name}`` for what is filled in at run time), ``watch``, ``apply``, the
    permissions it needs (``accesses``) and where the ``.http`` call is (``site``,
    ``path/to/file.py:line``)."""

    entry: str
    method: str
    path: str
    watch: bool
    apply: bool
    accesses: tuple[Access, ...]
    site: str


def access(
    method: str, path: str, *, watch: bool = False, apply: bool = False
) -> tuple[Access, ...]:
    """The permissions the API server checks for ``method`` on ``path`` (a template such as
    ``/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}``), as its request
    info does: ``GET`` an object ``get``, a collection ``list`` (``watch`` with ``watch=true``);
    ``POST`` ``create`` (to a subresource too: ``pods/eviction``); ``PUT`` ``update``; ``PATCH``
    ``patch``, and with a server-side apply (``apply``) also ``create`` (the API server checks it
    when the object is missing: ``handlers/patch.go``, ``createAuthorizerAttributes``);
    ``DELETE`` an object ``delete``, a collection ``deletecollection``.

    Raises ``ValueError`` naming the path or method when it is not a resource request of the
    forms ``/api/v1/...`` or ``/apis/<group>/<version>/...``."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a resource path (/api/v1/... or /apis/GROUP/VERSION/...): {path!r}")
    namespaced = len(rest) >= 3 and rest[0] == "namespaces"
    if namespaced:
        rest = rest[2:]
    if not 1 <= len(rest) <= 3:
        raise ValueError(f"not a resource path (RESOURCE[/NAME[/SUBRESOURCE]]): {path!r}")
    resource = rest[0] + (f"/{rest[2]}" if len(rest) == 3 else "")
    one = len(rest) >= 2
    verbs: tuple[str, ...]
    match method.upper():
        case "GET":
            verbs = ("get",) if one else ("watch",) if watch else ("list",)
        case "POST":
            verbs = ("create",)
        case "PUT":
            verbs = ("update",)
        case "PATCH":
            verbs = ("patch", "create") if apply else ("patch",)
        case "DELETE":
            verbs = ("delete",) if one else ("deletecollection",)
        case _:
            raise ValueError(f"not an API method (GET, POST, PUT, PATCH, DELETE): {method!r}")
    return tuple(Access(group, resource, v, namespaced) for v in verbs)


# -------------------------------------------------------------------------------- the scan ----


@dataclass(eq=False)
class _Func:
    module: str  # "kube.node_client" (relative to the package scanned)
    qualname: str  # "NodeClient.get_node"
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    file: str

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def package(self) -> str:
        return self.module.split(".")[0]

    @property
    def key(self) -> str:
        return f"{self.module}.{self.qualname}"

    def params(self) -> list[str]:
        a = self.node.args
        return [p.arg for p in (*a.posonlyargs, *a.args)]

    def default(self, param: str) -> ast.expr | None:
        a = self.node.args
        positional = [*a.posonlyargs, *a.args]
        for p, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True):
            if p.arg == param:
                return d
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if p.arg == param:
                return d
        return None

    def has_param(self, name: str) -> bool:
        a = self.node.args
        return name in self.params() or name in [p.arg for p in a.kwonlyargs]


@dataclass
class _Class:
    module: str
    name: str
    bases: list[str]
    #: attribute -> the expressions assigned to it (class body, or ``self.X =`` in a method)
    assigned: dict[str, list[tuple[ast.expr, _Func | None]]] = field(default_factory=dict)


class _NeedCaller(Exception):
    """The outermost frame's parameter is needed: extend the chain to its callers."""


@dataclass(frozen=True)
class _Value:
    text: str
    origin: str | None  # the class that assigned it (a ``self.<attr>`` path), else None


class _Index:
    def __init__(self, root: Path, package: str) -> None:
        self.root = root
        self.funcs: list[_Func] = []
        self.classes: dict[str, list[_Class]] = {}
        self.consts: dict[str, dict[str, ast.expr]] = {}
        self.imports: dict[str, dict[str, tuple[str, str]]] = {}  # module -> alias -> (mod, name)
        base = root / package
        for path in sorted(base.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            module = ".".join(parts) or "__init__"
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            self._module(
                tree, module, str(path.relative_to(root)), is_pkg=path.name == "__init__.py"
            )

    def _module(self, tree: ast.Module, module: str, file: str, is_pkg: bool) -> None:
        consts: dict[str, ast.expr] = {}
        imports: dict[str, tuple[str, str]] = {}
        here = module.split(".") if is_pkg else module.split(".")[:-1]
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                if isinstance(stmt.targets[0], ast.Name):
                    consts[stmt.targets[0].id] = stmt.value
            elif (
                isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value
            ):
                consts[stmt.target.id] = stmt.value
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                up = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join([*up, *(node.module.split(".") if node.module else [])])
                for alias in node.names:
                    imports[alias.asname or alias.name] = (target, alias.name)
        self.consts[module] = consts
        self.imports[module] = imports
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._func(stmt, module, None, stmt.name, file)
            elif isinstance(stmt, ast.ClassDef):
                cls = _Class(module, stmt.name, [_base_name(b) for b in stmt.bases])
                self.classes.setdefault(stmt.name, []).append(cls)
                for item in stmt.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        f = self._func(item, module, stmt.name, f"{stmt.name}.{item.name}", file)
                        for node in ast.walk(item):
                            if isinstance(node, ast.Assign):
                                for t in node.targets:
                                    if _is_self_attr(t):
                                        cls.assigned.setdefault(t.attr, []).append((node.value, f))  # type: ignore[union-attr]
                    elif isinstance(item, ast.Assign):
                        for t in item.targets:
                            if isinstance(t, ast.Name):
                                cls.assigned.setdefault(t.id, []).append((item.value, None))
                    elif (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.value
                    ):
                        cls.assigned.setdefault(item.target.id, []).append((item.value, None))

    def _func(self, node, module: str, cls: str | None, qualname: str, file: str) -> _Func:
        f = _Func(module, qualname, node, cls, file)
        self.funcs.append(f)
        return f

    # -- classes ----------------------------------------------------------------------------

    def family(self, cls: str, package: str) -> list[_Class]:
        """``cls``, its bases and its subclasses (by name, within ``package``)."""
        found: dict[tuple[str, str], _Class] = {}
        todo = [cls]
        while todo:  # bases
            name = todo.pop()
            for c in self.classes.get(name, []):
                if c.module.split(".")[0] == package and (c.module, c.name) not in found:
                    found[(c.module, c.name)] = c
                    todo.extend(c.bases)
        changed = True
        while changed:  # subclasses of anything found
            changed = False
            names = {c.name for c in found.values()}
            for group in self.classes.values():
                for c in group:
                    key = (c.module, c.name)
                    if (
                        key not in found
                        and c.module.split(".")[0] == package
                        and names & set(c.bases)
                    ):
                        found[key] = c
                        changed = True
        return list(found.values())

    # -- callers ----------------------------------------------------------------------------

    def callers(self, f: _Func) -> list[tuple[ast.Call, _Func, bool]]:
        """The calls of ``f`` inside its package: ``(call, caller, bound)``; ``bound``: a
        ``self.m(...)`` call (its arguments start after ``self``)."""
        out: list[tuple[ast.Call, _Func, bool]] = []
        family = {c.name for c in self.family(f.cls, f.package)} if f.cls else set()
        for g in self.funcs:
            if g.package != f.package:
                continue
            for node in ast.walk(g.node):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func
                if f.cls:
                    if (
                        isinstance(fn, ast.Attribute)
                        and fn.attr == f.name
                        and isinstance(fn.value, ast.Name)
                        and fn.value.id == "self"
                        and g.cls in family
                    ):
                        out.append((node, g, True))
                elif isinstance(fn, ast.Name) and fn.id == f.name:
                    if (
                        g.module == f.module
                        or self.imports[g.module].get(fn.id, ("", ""))[0] == f.module
                    ):
                        out.append((node, g, False))
        return out


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_self_attr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


@dataclass
class _Chain:
    """Frames from the ``.http`` call's function outwards; ``calls[i]``: the call in
    ``funcs[i + 1]`` of ``funcs[i]`` (``bound[i]``: through ``self.``)."""

    funcs: list[_Func]
    calls: list[ast.Call]
    bound: list[bool]


class _Eval:
    def __init__(self, index: _Index, chain: _Chain) -> None:
        self.index, self.chain = index, chain

    def __call__(self, expr: ast.expr, i: int = 0) -> list[_Value]:
        f = self.chain.funcs[i]
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [_Value(expr.value, None)]
        if isinstance(expr, ast.Constant) and expr.value is None:
            return []  # no value (an optional content type)
        if isinstance(expr, ast.IfExp):  # either branch
            return [*self(expr.body, i), *self(expr.orelse, i)]
        if isinstance(expr, ast.JoinedStr):
            text = ""
            for part in expr.values:
                if isinstance(part, ast.Constant):
                    text += str(part.value)
                else:  # filled in at run time: a placeholder, as the path_params ones
                    text += "{" + _placeholder(part.value) + "}"  # type: ignore[attr-defined]
            return [_Value(text, None)]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return [
                _Value(a.text + b.text, a.origin or b.origin)
                for a in self(expr.left, i)
                for b in self(expr.right, i)
            ]
        if isinstance(expr, ast.Name):
            return self._name(expr.id, f, i)
        if _is_self_attr(expr) and f.cls:
            return self._attribute(expr.attr, f)  # type: ignore[attr-defined]
        raise ScanError(f"{f.file}:{expr.lineno}: cannot tell the value of {ast.unparse(expr)}")

    def _name(self, name: str, f: _Func, i: int) -> list[_Value]:
        if f.has_param(name):
            if i >= len(self.chain.calls):
                raise _NeedCaller(name)
            call, bound = self.chain.calls[i], self.chain.bound[i]
            arg = _argument(call, f, name, bound)
            if arg is not None:
                return self(arg, i + 1)
            default = f.default(name)
            if default is None:
                raise ScanError(f"{f.file}:{call.lineno}: no argument for {name!r} of {f.key}")
            return self(default, i)
        local = [
            n.value
            for n in ast.walk(f.node)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        ]
        if len(local) == 1:
            return self(local[0], i)
        const = self.index.consts[f.module].get(name)
        if const is None and name in self.index.imports[f.module]:
            module, original = self.index.imports[f.module][name]
            const = self.index.consts.get(module, {}).get(original)
        if const is not None:
            return self(const, i)
        raise ScanError(f"{f.file}:{f.node.lineno}: cannot tell the value of {name!r} in {f.key}")

    def _attribute(self, attr: str, f: _Func) -> list[_Value]:
        out: list[_Value] = []
        assert f.cls
        for cls in self.index.family(f.cls, f.package):
            for expr, method in cls.assigned.get(attr, []):
                frame = method or f
                try:
                    values = _Eval(self.index, _Chain([frame], [], []))(expr)
                except _NeedCaller:  # self.<attr> = <an argument>: not followed
                    raise ScanError(
                        f"{frame.file}: self.{attr} of {cls.name} is set from an argument"
                    ) from None
                out += [_Value(v.text, f"{cls.module}.{cls.name}") for v in values if v.text]
        if not out:
            raise ScanError(f"{f.file}: no class of {f.cls}'s family sets self.{attr}")
        return out


def _placeholder(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return "value"


def _argument(call: ast.Call, f: _Func, name: str, bound: bool) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    params = f.params()
    if name in params:
        index = params.index(name) - (1 if bound else 0)
        if 0 <= index < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args[: index + 1]
        ):
            return call.args[index]
    return None


def _keyword(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and position < len(call.args):
        return call.args[position]
    return None


def _http_calls(index: _Index) -> Iterator[tuple[_Func, ast.Call]]:
    for f in index.funcs:
        for node in ast.walk(f.node):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "http" and f.key != "kube.session.ApiSession.http":
                    yield f, node


def _watch(query: ast.expr | None) -> bool:
    return isinstance(query, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "watch" for k in query.keys
    )


def scan(root: Path, package: str = "omaticaya_py") -> list[Request]:
    """Every request the code under ``root/package`` can make (see the module): one
    ``Request`` per ``.http(...)`` call, method, path and entry. Raises ``ScanError`` for a call
    whose method or path cannot be worked out, or one whose path ``access`` refuses."""
    index = _Index(root, package)
    out: list[Request] = []
    for f, call in _http_calls(index):
        site = f"{f.file}:{call.lineno}"
        method_expr, path_expr = _keyword(call, "method", 0), _keyword(call, "path", 1)
        if method_expr is None or path_expr is None:
            raise ScanError(f"{site}: .http() without a method and a path")
        content = _keyword(call, "content_type")
        watch = _watch(_keyword(call, "query"))
        todo = [_Chain([f], [], [])]
        while todo:
            chain = todo.pop()
            ev = _Eval(index, chain)
            try:
                methods, paths = ev(method_expr), ev(path_expr)
                contents = ev(content) if content is not None else []
            except _NeedCaller:
                outer = chain.funcs[-1]
                callers = [c for c in index.callers(outer) if c[1] not in chain.funcs]
                if not callers:
                    raise ScanError(
                        f"{site}: the method or path comes from {outer.key}'s arguments, and "
                        f"nothing in {outer.package}/ calls it"
                    ) from None
                for c, g, bound in callers:
                    todo.append(_Chain([*chain.funcs, g], [*chain.calls, c], [*chain.bound, bound]))
                continue
            apply = any(v.text == APPLY for v in contents)
            for entry in _entries(index, chain):
                for m in methods:
                    for p in paths:
                        try:
                            accesses = access(m.text, p.text, watch=watch, apply=apply)
                        except ValueError as exc:
                            raise ScanError(f"{site}: {exc}") from None
                        out.append(
                            Request(p.origin or entry, m.text, p.text, watch, apply, accesses, site)
                        )
    return out


def _entries(index: _Index, chain: _Chain, depth: int = 12) -> list[str]:
    """The outermost functions of the chain's package that reach its last frame: the chain
    extended through every caller in the package (none: the last frame itself)."""
    outer = chain.funcs[-1]
    callers = [c for c in index.callers(outer) if c[1] not in chain.funcs]
    if not callers or depth == 0:
        return [outer.key]
    out: list[str] = []
    for c, g, bound in callers:
        out += _entries(
            index, _Chain([*chain.funcs, g], [*chain.calls, c], [*chain.bound, bound]), depth - 1
        )
    return sorted(set(out))
