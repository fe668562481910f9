"""The command-line flags an installed SGLang accepts, read from its sources with ``ast``, never imported.

Importing ``sglang.srt.server_args`` pulls in torch and takes seconds (minutes on a cold
cache); a wrong flag is only reported *after* that, by argparse, with exit status 2. So the
doctor reads the parser definition with ``ast`` instead:

* SGLang 0.5.2x derives its flags from annotated fields (``name: A[T, Arg(...)] = default``)
  of the namespace structs in ``sglang/srt/arg_groups/fields/`` (``cli_name``, ``aliases``,
  ``no_cli``, ``action``, ``nargs``, ``choices``), plus a few ``parser.add_argument`` calls
  left in ``ServerArgs.add_cli_args`` (dynamic choices, deprecated spellings).
* Older releases (0.5.13 and before) call ``parser.add_argument`` for every flag in
  ``ServerArgs.add_cli_args`` in ``sglang/srt/server_args.py``.

The result is a ``FlagTable``; ``doctor.sglang.flag_validator`` judges an argv against it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.core.fileio import read_text

MAX_SOURCE_BYTES = 16 * 1024 * 1024  # server_args.py is ~200 kB
SCHEMA = 1
_ZERO_ARG_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}


class FlagSourceError(Exception):
    """The sources could not be read as an SGLang parser definition."""


# -- reading the sources ----------------------------------------------------------------------

@dataclass
class _Module:
    path: Path
    tree: ast.Module
    text: str
    _imports: dict[str, str] | None = None

    def imports(self) -> dict[str, str]:
        """``local name -> dotted module`` for ``from X import name`` at any level of the file."""
        if self._imports is None:
            out: dict[str, str] = {}
            for node in ast.walk(self.tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        out[alias.asname or alias.name] = node.module
            self._imports = out
        return self._imports

    def toplevel_assign(self, name: str) -> ast.expr | None:
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == name:
                        return node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return node.value
        return None

    def find_class(self, name: str) -> ast.ClassDef | None:
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None


class _Sources:
    """Parsed modules of one ``sglang`` package directory, by dotted name, cached."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir
        self.root = package_dir.parent
        self._cache: dict[str, _Module | None] = {}
        self.read: list[str] = []

    def module(self, dotted: str) -> _Module | None:
        if dotted in self._cache:
            return self._cache[dotted]
        mod = None
        if dotted == "sglang" or dotted.startswith("sglang."):
            base = self.root.joinpath(*dotted.split("."))
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if path.is_file():
                    mod = self._parse(path)
                    break
        self._cache[dotted] = mod
        return mod

    def _parse(self, path: Path) -> _Module | None:
        try:
            text = read_text(path, MAX_SOURCE_BYTES, "Python source", errors="replace")
            tree = ast.parse(text, filename=str(path))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        self.read.append(str(path.relative_to(self.root)))
        return _Module(path, tree, text)


def _const(node: ast.expr | None) -> Any:
    """A literal value, or ``_Unknown``."""
    if node is None:
        return _UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


class _Unknown:
    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return "<unknown>"


_UNKNOWN = _Unknown()


def _name_of(node: ast.expr | None) -> str | None:
    """``foo`` or ``a.b.foo`` -> the last part."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class _Choices:
    """Resolve a ``choices=`` expression: literal lists, named constants (followed through
    ``from ... import``), ``A + B``. ``strict`` is False when the source extends a constant at
    run time (``add_attention_backend_choices = ATTENTION_BACKEND_CHOICES.extend``): a plugin
    may then accept more values than the source lists."""

    def __init__(self, sources: _Sources) -> None:
        self.sources = sources
        self.scope: ast.FunctionDef | None = None  # the parser function being read (its locals)

    def resolve(self, node: ast.expr, mod: _Module, depth: int = 0) -> tuple[list[Any] | None, bool]:
        if depth > 10:
            return None, False
        value = _const(node)
        if not isinstance(value, _Unknown):
            if isinstance(value, (list, tuple, set, frozenset)):
                return sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value), True
            return None, False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, ls = self.resolve(node.left, mod, depth + 1)
            right, rs = self.resolve(node.right, mod, depth + 1)
            if left is not None and right is not None:
                return left + right, ls and rs
            return None, False
        if isinstance(node, ast.Call) and _name_of(node.func) in {"set", "frozenset", "list", "tuple", "sorted"} \
                and len(node.args) == 1:
            return self.resolve(node.args[0], mod, depth + 1)
        if isinstance(node, ast.Name):
            got, strict = self._named(node.id, mod, depth)
            if got is None and self.scope is not None:
                got = self._local(node.id, mod, depth)
                strict = False  # computed at run time: a registry plugins can extend
            return got, strict
        return None, False

    def _local(self, name: str, mod: _Module, depth: int) -> list[Any] | None:
        """``name = helper()`` in the parser function, ``helper`` returning a resolvable list."""
        for node in ast.walk(self.scope) if self.scope is not None else ():
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                    and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                helper = next((n for n in mod.tree.body if isinstance(n, ast.FunctionDef)
                               and n.name == node.value.func.id), None)
                returns = [r.value for r in ast.walk(helper) if isinstance(r, ast.Return) and r.value is not None] \
                    if helper is not None else []
                scope, self.scope = self.scope, None
                try:
                    for expr in reversed(returns):  # the last return: the registry fallback
                        got, _ = self.resolve(expr, mod, depth + 1)
                        if got is not None:
                            return got
                finally:
                    self.scope = scope
        return None

    def _named(self, name: str, mod: _Module, depth: int) -> tuple[list[Any] | None, bool]:
        value = mod.toplevel_assign(name)
        if value is not None:
            got, strict = self.resolve(value, mod, depth + 1)
            mutated = _mutated(mod.text, name)
            return got, strict and not mutated
        origin = mod.imports().get(name)
        if origin:
            other = self.sources.module(origin)
            if other is not None:
                return self._named(name, other, depth + 1)
        return None, False


_MUTATION = re.compile(r"\s*(\.(extend|append|add|update)\b|\+=|\|=)")


def _mutated(text: str, name: str) -> bool:
    """Whether the module extends ``name`` at run time (``NAME.extend``, ``NAME +=``...)."""
    start = text.find(name)
    while start != -1:
        end = start + len(name)
        before_ok = start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_")
        if before_ok and _MUTATION.match(text, end):
            return True
        start = text.find(name, end)
    return False


@dataclass
class FlagTable:
    """The options of one SGLang release: ``options`` maps every option string to its spec."""

    version: str | None = None
    style: str = ""  # "fields" (0.5.2x) or "add_argument"
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, opts: list[str], spec: dict[str, Any], action: str | None = None) -> None:
        """Register ``opts`` with ``spec``; a BooleanOptionalAction also gets each ``--no-`` form."""
        for opt in opts:
            self.options[opt] = spec
        if action == "BooleanOptionalAction":
            for opt in opts:
                if opt.startswith("--"):
                    self.options["--no-" + opt[2:]] = dict(spec)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": self.version, "style": self.style, "options": self.options,
                "files": self.files, "notes": self.notes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlagTable:
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            raise FlagSourceError("flag table has no 'options' mapping")
        return cls(data.get("version"), str(data.get("style", "")), dict(data["options"]),
                   list(data.get("files") or []), list(data.get("notes") or []))


def _spec(dest: str, *, nargs: Any = 1, choices: list[Any] | None = None, strict: bool = True,
          type_name: str | None = None, deprecated: str | None = None, required: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"dest": dest, "nargs": nargs}
    if choices is not None:
        spec["choices"] = [c if isinstance(c, (str, int, float, bool)) else str(c) for c in choices]
        spec["choices_strict"] = strict
    if type_name:
        spec["type"] = type_name
    if deprecated is not None:
        spec["deprecated"] = deprecated
    if required:
        spec["required"] = True
    return spec


def _action_info(node: ast.expr | None, sources: _Sources, mod: _Module) -> tuple[str | None, Any]:
    """(action name, nargs implied by it or ``None`` if it takes the parser's default)."""
    if node is None:
        return None, None
    name = _name_of(node)
    if name is None:
        return None, None
    if name in _ZERO_ARG_ACTIONS:
        return name, 0
    if name == "BooleanOptionalAction":
        return name, 0
    # A custom argparse.Action subclass: look up its __init__ default for nargs.
    cls, cls_mod = _find_class(name, sources, mod)
    if cls is not None and cls_mod is not None:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                names = [a.arg for a in args.args]
                defaults = dict(zip(names[len(names) - len(args.defaults):], args.defaults, strict=False))
                defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False)
                                 if d is not None})
                if "nargs" in defaults:
                    value = _const(defaults["nargs"])
                    return name, (1 if value is None else value) if not isinstance(value, _Unknown) else None
    return name, None


def _find_class(name: str, sources: _Sources, mod: _Module) -> tuple[ast.ClassDef | None, _Module | None]:
    cls = mod.find_class(name)
    if cls is not None:
        return cls, mod
    origin = mod.imports().get(name)
    if origin:
        other = sources.module(origin)
        if other is not None:
            return other.find_class(name), other
    return None, None


def _kw(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _add_argument(table: FlagTable, call: ast.Call, sources: _Sources, mod: _Module, resolver: _Choices) -> None:
    names = [_const(a) for a in call.args]
    opts = [n for n in names if isinstance(n, str) and n.startswith("-")]
    if not opts:
        if any(isinstance(n, _Unknown) for n in names):
            table.notes.append(f"{mod.path.name}:{call.lineno}: add_argument with computed option names, ignored")
        return
    kw = _kw(call)
    dest = _const(kw.get("dest"))
    long = next((o for o in opts if o.startswith("--")), opts[0])
    dest = dest if isinstance(dest, str) else long.lstrip("-").replace("-", "_")
    action, nargs = _action_info(kw.get("action"), sources, mod)
    if "nargs" in kw:
        nargs = _nargs_of(kw["nargs"])
    choices, strict = resolver.resolve(kw["choices"], mod) if "choices" in kw else (None, True)
    type_name = _name_of(kw.get("type")) if "type" in kw else None
    spec = _spec(dest, nargs=1 if nargs is None else nargs, choices=choices, strict=strict,
                 type_name=type_name if type_name in ("int", "float") else None,
                 deprecated=_deprecated_for(action, kw), required=_const(kw.get("required")) is True)
    table.add(opts, spec, action)


def _deprecated_for(action: str | None, kw: dict[str, ast.expr]) -> str | None:
    """What a deprecating action says of the flag: its ``new_flag`` ("" when it names none); ``None`` when
    the action deprecates nothing."""
    if not action or "Deprecat" not in action:
        return None
    new = _const(kw.get("new_flag"))
    return new if isinstance(new, str) else ""


def _annotated_parts(annotation: ast.expr) -> list[ast.expr] | None:
    """``A[T, meta, ...]`` / ``Annotated[T, ...]`` -> ``[T, meta, ...]``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if not isinstance(annotation, ast.Subscript) or _name_of(annotation.value) not in ("A", "Annotated"):
        return None
    inner = annotation.slice
    if isinstance(inner, ast.Index):  # pragma: no cover - Python 3.8 ast
        inner = inner.value  # type: ignore[attr-defined]
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _unwrap_optional(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.Subscript) and _name_of(node.value) == "Union":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(b, ast.Constant) and b.value is None:
                return a
    return node


def _field_flag(table: FlagTable, stmt: ast.AnnAssign, sources: _Sources, mod: _Module, resolver: _Choices) -> None:
    """One annotated field, as ``arg_utils.add_cli_args_from_dataclass`` turns it into a flag."""
    found = _field_meta(stmt)
    if found is None:
        return
    name, raw_type, meta = found
    opts = _field_options(name, meta)
    choices, strict = (None, True)
    if "choices" in meta:
        choices, strict = resolver.resolve(meta["choices"], mod)
    if "action" in meta:
        action, nargs = _field_action(meta, sources, mod)
        table.add(opts, _spec(name, nargs=nargs, choices=choices, strict=strict), action)
        return
    choices, strict, type_name, nargs = _typed_shape(_unwrap_optional(raw_type), meta, choices, strict)
    if "nargs" in meta:
        nargs = _nargs_of(meta["nargs"])
    required = _const(meta.get("required")) is True or (
        _const(meta.get("required")) is not False and stmt.value is None and nargs != 0)
    table.add(opts, _spec(name, nargs=nargs, choices=choices, strict=strict, type_name=type_name, required=required))


def _field_meta(stmt: ast.AnnAssign) -> tuple[str, ast.expr, dict[str, ast.expr]] | None:
    """(name, annotated type, ``Arg(...)`` keywords) of a field that is a CLI flag; None for one that is not (no
    ``Arg`` nor help string in its ``Annotated``, or ``no_cli=True``). A help string alone: a flag with no keywords."""
    if not isinstance(stmt.target, ast.Name):
        return None
    parts = _annotated_parts(stmt.annotation)
    if not parts:
        return None
    meta: dict[str, ast.expr] | None = None
    for m in parts[1:]:
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            meta = {}
            break
        if isinstance(m, ast.Call) and _name_of(m.func) == "Arg":
            meta = _kw(m)
            break
    if meta is None or _const(meta.get("no_cli")) is True:
        return None
    return stmt.target.id, parts[0], meta


def _field_options(name: str, meta: dict[str, ast.expr]) -> list[str]:
    """The option strings: ``cli_name`` (else ``--`` and the field's name with dashes), then the aliases."""
    cli = _const(meta.get("cli_name"))
    cli = cli if isinstance(cli, str) else "--" + name.replace("_", "-")
    aliases = _const(meta.get("aliases"))
    return [cli] + ([a for a in aliases if isinstance(a, str)] if isinstance(aliases, (list, tuple)) else [])


def _nargs_of(expr: ast.expr) -> Any:
    """A ``nargs`` the source spells: its value, 1 for None (argparse's one value), ``*`` when not a constant."""
    value = _const(expr)
    return "*" if isinstance(value, _Unknown) else (1 if value is None else value)


def _field_action(meta: dict[str, ast.expr], sources: _Sources, mod: _Module) -> tuple[Any, Any]:
    """(action, nargs) of a field with ``action=``: the nargs the action implies, unless ``action_kwargs``
    names one."""
    action, implied = _action_info(meta["action"], sources, mod)
    nargs = implied if implied is not None else 1
    akw = meta.get("action_kwargs")
    if isinstance(akw, ast.Dict):
        for k, v in zip(akw.keys, akw.values, strict=False):
            if _const(k) == "nargs":
                nargs = _nargs_of(v)
    return action, nargs


def _typed_shape(inner: ast.expr, meta: dict[str, ast.expr], choices: Any, strict: bool
                 ) -> tuple[Any, bool, str | None, Any]:
    """(choices, strict, type name, nargs) that the field's type gives the flag: a ``Literal`` its choices (and
    argparse's type from the first), a list ``+`` values, a bool no value, an int or float its type."""
    type_name: str | None = None
    nargs: Any = 1
    head = _name_of(inner.value) if isinstance(inner, ast.Subscript) else _name_of(inner)
    if head == "Literal" and isinstance(inner, ast.Subscript):
        lit = _const(inner.slice)
        if not isinstance(lit, _Unknown) and choices is None:
            choices, strict = (list(lit) if isinstance(lit, tuple) else [lit]), True
        if choices and "type_parser" not in meta and type(choices[0]) in (int, float):
            type_name = type(choices[0]).__name__  # argparse's type= is inferred from the first literal
    elif head in ("List", "list") and "type_parser" not in meta:
        nargs = "+"
        elem = _name_of(inner.slice) if isinstance(inner, ast.Subscript) else None
        type_name = elem if elem in ("int", "float") else None
    elif head == "bool" and not isinstance(inner, ast.Subscript):
        nargs = 0
    elif head in ("int", "float") and "type_parser" not in meta:
        type_name = head
    return choices, strict, type_name, nargs


def _struct_fields(table: FlagTable, cls: ast.ClassDef, sources: _Sources, mod: _Module, resolver: _Choices) -> None:
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign):
            _field_flag(table, stmt, sources, mod, resolver)


def _namespace_classes(server_args: _Module, sources: _Sources) -> list[tuple[ast.ClassDef, _Module]]:
    """The structs ServerArgs collects its fields from (``collect_input_fields(NAMES)``); else, every namespace
    struct (``_NS_PATH = ...``) in arg_groups/fields/."""
    found: list[tuple[ast.ClassDef, _Module]] = []
    for node in ast.walk(server_args.tree):
        if isinstance(node, ast.Call) and _name_of(node.func) == "collect_input_fields" and node.args:
            found.extend(_collected_classes(node.args[0], server_args, sources))
    return found or _fields_dir_classes(sources)


def _collected_classes(arg: ast.expr, server_args: _Module, sources: _Sources) -> list[tuple[ast.ClassDef, _Module]]:
    """The classes one ``collect_input_fields(NAMES)`` names: a list or tuple written there or assigned to a
    top-level name; a class that cannot be found is left out."""
    if isinstance(arg, ast.Name):
        arg = server_args.toplevel_assign(arg.id) or arg
    if not isinstance(arg, (ast.List, ast.Tuple)):
        return []
    found: list[tuple[ast.ClassDef, _Module]] = []
    for name in filter(None, (_name_of(elt) for elt in arg.elts)):
        cls, cls_mod = _find_class(name, sources, server_args)
        if cls is not None and cls_mod is not None:
            found.append((cls, cls_mod))
    return found


def _fields_dir_classes(sources: _Sources) -> list[tuple[ast.ClassDef, _Module]]:
    """Every class of ``arg_groups/fields/*.py`` that sets ``_NS_PATH``: a namespace struct of the parser."""
    fields_dir = sources.package_dir / "srt" / "arg_groups" / "fields"
    found: list[tuple[ast.ClassDef, _Module]] = []
    for path in sorted(fields_dir.glob("*.py")) if fields_dir.is_dir() else []:
        mod = sources.module("sglang.srt.arg_groups.fields." + path.stem) if path.stem != "__init__" else None
        if mod is None:
            continue
        found.extend((node, mod) for node in mod.tree.body if isinstance(node, ast.ClassDef) and any(
            isinstance(s, ast.Assign) and any(_name_of(t) == "_NS_PATH" for t in s.targets) for s in node.body))
    return found


def _walk_parser_function(table: FlagTable, func: ast.FunctionDef, sources: _Sources, mod: _Module,
                          resolver: _Choices, seen: set[str], depth: int = 0) -> None:
    """Every ``*.add_argument`` in ``func``; ``add_cli_args_from_dataclass(parser, X)``; helpers it calls."""
    resolver.scope = func
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        fname = _name_of(node.func)
        if isinstance(node.func, ast.Attribute) and fname == "add_argument":
            _add_argument(table, node, sources, mod, resolver)
        elif fname == "add_cli_args_from_dataclass" and len(node.args) >= 2:
            _dataclass_flags(table, _name_of(node.args[1]), sources, mod, resolver)
        elif fname and depth < 3:
            helper = _parser_helper(node, fname, mod, seen)
            if helper is not None and helper is not func:
                _walk_parser_function(table, helper, sources, mod, resolver, seen, depth + 1)
                resolver.scope = func


def _parser_helper(call: ast.Call, fname: str, mod: _Module, seen: set[str]) -> ast.FunctionDef | None:
    """The module's function a call hands the parser to (``helper(parser, ...)``), the first time it is seen
    (``seen`` is updated): its ``add_argument`` calls are the parser's too."""
    if fname in seen or not any(isinstance(a, ast.Name) and a.id == "parser" for a in call.args):
        return None
    seen.add(fname)
    return next((n for n in ast.walk(mod.tree) if isinstance(n, ast.FunctionDef) and n.name == fname), None)


def _dataclass_flags(table: FlagTable, target: str | None, sources: _Sources, mod: _Module, resolver: _Choices
                     ) -> None:
    """The flags ``add_cli_args_from_dataclass(parser, target)`` adds: ServerArgs's own fields and those of the
    namespace structs it collects, or another dataclass's fields."""
    if target == "ServerArgs":
        table.style = "fields"
        cls = mod.find_class("ServerArgs")
        if cls is not None:
            _struct_fields(table, cls, sources, mod, resolver)
        for ns_cls, ns_mod in _namespace_classes(mod, sources):
            _struct_fields(table, ns_cls, sources, ns_mod, resolver)
    elif target:
        cls, cls_mod = _find_class(target, sources, mod)
        if cls is not None and cls_mod is not None:
            _struct_fields(table, cls, sources, cls_mod, resolver)


def read_flags(package_dir: str | Path, version: str | None = None) -> FlagTable:
    """The flag table of the ``sglang`` package in ``package_dir`` (the directory holding ``srt/``)."""
    package_dir = Path(package_dir)
    sources = _Sources(package_dir)
    mod = sources.module("sglang.srt.server_args")
    if mod is None:
        raise FlagSourceError(f"{package_dir}/srt/server_args.py is missing or not valid Python")
    cls = mod.find_class("ServerArgs")
    func = None
    if cls is not None:
        func = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"), None)
    if func is None:
        raise FlagSourceError(f"{mod.path}: no ServerArgs.add_cli_args; this SGLang layout is not known")
    table = FlagTable(version=version, style="add_argument")
    _walk_parser_function(table, func, sources, mod, _Choices(sources), {"add_cli_args"})
    if len(table.options) < 20:
        raise FlagSourceError(f"only {len(table.options)} flags found in {mod.path}: the parser layout is not "
                              "one this doctor can read")
    table.files = sorted(sources.read)
    return table
