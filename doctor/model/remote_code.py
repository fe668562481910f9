"""The model's remote code (``auto_map`` in config.json and tokenizer_config.json), read, never run.

With ``--trust-remote-code`` transformers copies every Python file ``auto_map`` names into its module
cache, with the files those import relatively (``from .tool_declaration_ts import ...``), then
imports them: a missing file fails the start after the weights loaded, and so does an absolute import
the service's environment lacks (transformers' ``check_imports``) or one a newer transformers no
longer provides (``bytes_to_unicode`` from the GPT-2 tokenizer module, gone in transformers 5). This
module finds all of that with ``ast``; the tokenizer probe then checks the imports against the
service's interpreter.
"""

from __future__ import annotations

import ast
import os
import shlex
from pathlib import Path
from typing import Any

from doctor.core.datafile import load_toml
from doctor.core.fileio import describe_error, read_text
from doctor.core.result import Findings

COMPAT_FILE = Path(__file__).resolve().parents[1] / "data" / "tokenizer_compat.toml"
MAX_SOURCE_BYTES = 2 * 1024 * 1024
MAX_FILES = 32
# model.tokenizer's failures for the modules auto_map names itself (each with its own fix)
MODULE_MISSING = "model.tokenizer.module_missing"  # not in the model directory: a download of the module fixes it
MODULE_OUTSIDE = "model.tokenizer.module_outside"  # outside the model directory: auto_map must name one inside


def compat_table(path: Path = COMPAT_FILE) -> dict[str, Any]:
    return load_toml(path)


def auto_map_refs(auto_map: Any) -> list[str]:
    """``"module.Class"`` references of an ``auto_map`` (lists hold [slow, fast]; ``None`` entries skipped)."""
    refs: list[str] = []
    if isinstance(auto_map, dict):
        for value in auto_map.values():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and "." in ref and ref not in refs:
                    refs.append(ref)
    return refs


def outside_name(name: str) -> bool:
    """A file name that does not stay inside the model directory: absolute, or with an empty or ``..`` part
    (``"/opt/x.py"``, ``"..x.Cls"`` read as ``//x.py``)."""
    parts = name.split("/")
    return name.startswith("/") or any(p in ("", "..") for p in parts)


def module_file(ref: str) -> str | None:
    """``"tokenization_kimi.TikTokenTokenizer"`` -> ``"tokenization_kimi.py"``; ``None`` for code in another
    repository (``"org/repo--module.Class"``)."""
    if "--" in ref:
        return None
    module = ref.rsplit(".", 1)[0]
    return module.replace(".", "/") + ".py"


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside a ``try`` (transformers' import check strips try/except blocks too)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            return True
    return False


def analyse_source(text: str) -> dict[str, Any]:
    """Relative imports (sibling files), absolute top-level imports outside ``try``, imports the compat
    table knows a transformers release removed, and a tokenizer's ``num_reserved_special_tokens``."""
    tree = ast.parse(text)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    relative: list[str] = []
    imports: set[str] = set()
    moved: list[dict[str, Any]] = []
    known = {(m["module"], m["name"]): m for m in compat_table().get("moved_imports", [])}
    reserved = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            relative += _relative_files(node)
        elif isinstance(node, ast.ImportFrom):
            if node.module and not _guarded(node, parents):
                imports.add(node.module.split(".")[0])
                moved += _moved_imports(node, known)
        elif isinstance(node, ast.Import) and not _guarded(node, parents):
            imports.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ClassDef):
            found = _class_reserved(node)
            reserved = reserved if found is None else found
    return {"relative": sorted(set(relative)), "imports": sorted(imports), "moved": moved,
            "num_reserved_special_tokens": reserved}


def _relative_files(node: ast.ImportFrom) -> list[str]:
    """The sibling files a relative import reads (``from .x import y``: x.py; ``from . import y``: y.py): the
    remote code needs them beside it in the model directory."""
    names = [node.module] if node.module else [a.name for a in node.names]
    return [n.replace(".", "/") + ".py" for n in names if n]


def _moved_imports(node: ast.ImportFrom, known: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The names of one absolute ``from M import ...`` that the compat table (``known``) says a transformers
    release moved away from M: the remote code fails to import under that release and later."""
    out: list[dict[str, Any]] = []
    for alias in node.names:
        hit = known.get((node.module or "", alias.name))
        if hit:
            out.append({"module": node.module, "name": alias.name, "line": node.lineno,
                        "gone_from": hit["gone_from"], "now_in": hit.get("now_in")})
    return out


def _class_reserved(node: ast.ClassDef) -> int | None:
    """A class's ``num_reserved_special_tokens = <int>`` (the last one), or None: the tokenizer's special ids
    follow the vocabulary's tokens in that many reserved slots."""
    reserved = None
    for stmt in node.body:
        names = [t.id for t in stmt.targets if isinstance(t, ast.Name)] if isinstance(stmt, ast.Assign) else []
        if "num_reserved_special_tokens" in names and isinstance(stmt.value, ast.Constant) \
                and type(stmt.value.value) is int:
            reserved = stmt.value.value
    return reserved


def scan_remote_code(model_dir: str, refs: list[str]) -> dict[str, Any]:
    """Every file ``refs`` name and, transitively, the files they import relatively; never raises."""
    out: dict[str, Any] = {"refs": list(refs), "external": [r for r in refs if "--" in r], "files": {},
                           "missing": []}
    queue = [f for f in (module_file(r) for r in refs) if f]
    needed_by: dict[str, str | None] = dict.fromkeys(queue)
    while queue and len(out["files"]) < MAX_FILES:
        name = queue.pop(0)
        if name in out["files"]:
            continue
        rec: dict[str, Any] = {"needed_by": needed_by.get(name)}
        out["files"][name] = rec
        if outside_name(name):  # never read: transformers takes remote code from the model directory only
            rec.update(present=os.path.lexists(name) if name.startswith("/") else False, outside=True)
            out.setdefault("outside", []).append(name)
            continue
        path = os.path.join(model_dir, name)
        try:
            text = read_text(path, MAX_SOURCE_BYTES, "Python source")
        except FileNotFoundError:
            rec["present"] = os.path.islink(path)
            if rec["present"]:
                rec["error"] = describe_error(FileNotFoundError(2, "No such file or directory", path))
            else:
                out["missing"].append(name)
            continue
        except OSError as exc:  # a FIFO, a device, a symlink loop, too large, unreadable: said as such
            rec["present"] = True
            rec["error"] = exc.strerror or str(exc)
            continue
        except UnicodeDecodeError as exc:
            rec["present"] = True
            rec["error"] = f"not readable Python: {type(exc).__name__}: {exc}"
            continue
        rec["present"] = True
        try:
            rec.update(analyse_source(text))
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            rec["error"] = f"not readable Python: {type(exc).__name__}: {exc}"
            continue
        for sibling in rec.get("relative", []):
            if sibling not in out["files"] and sibling not in queue:
                needed_by.setdefault(sibling, name)
                queue.append(sibling)
    return out


def named_module_problems(remote: dict[str, Any]) -> Findings:
    """What is wrong with the modules ``auto_map`` names itself (``scan_remote_code``'s record: files with no
    ``needed_by``), a failure each: ``MODULE_OUTSIDE`` for a module outside the model directory (it may well
    exist: transformers does not look there; never said "missing"), ``MODULE_MISSING`` for one that is not there
    (``details["download"]``: the files a download fixes)."""
    out = Findings(download=[])
    files = remote.get("files") if isinstance(remote.get("files"), dict) else {}
    for name, rec in files.items():
        if not isinstance(rec, dict) or rec.get("needed_by"):
            continue
        if rec.get("outside"):
            out.fail(MODULE_OUTSIDE, f"remote-code module {name} named by auto_map is outside the model directory"
                     + (" (it exists there, but" if rec.get("present") else " (")
                     + " transformers loads remote code only from the model directory): name a module "
                     "inside it, as the model's repository does")
        elif rec.get("present") is False:
            out.fail(MODULE_MISSING, f"remote-code module {name} named by auto_map is missing")
            out.details["download"].append(name)
    return out


def download_command(repo: str | None, model_dir: str | None, files: list[str]) -> str:
    """``hf download REPO --include F ... --local-dir DIR`` for ``files`` (a placeholder repo when the
    profile names none)."""
    argv = ["hf", "download", repo or "<model repo>"]
    for name in files:
        argv += ["--include", name]
    argv += ["--local-dir", str(model_dir or "<model dir>")]
    return shlex.join(argv)
