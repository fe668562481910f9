"""The layering rules of DEVELOPING.md, read from the sources' AST (the folder listing is the architecture).

1. No module imports another module's private (underscore) names.
2. ``fixes/`` and ``doctor/`` never import ``checks``.
3. Every ``checks/<area>.py`` and ``fixes/<area>.py`` has its domain package ``doctor/<area>/``.
4. One exit-code module and one crash-safe writer.
5. No input looked for at a machine-specific absolute path (the machine the project is built on keeps its
   shared files under ``/work``): what the code and the tests read is in the repository.
6. One safe reader: no module reads a file by name itself (``open()`` for reading, ``Path.read_text``,
   ``Path.read_bytes``, ``json.load``); ``doctor.core.fileio`` does (a FIFO never blocks, sizes are capped).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("doctor", "checks", "fixes")
SOURCE_TREES = (*PACKAGES, "tests", "bench", "scripts", "tools", "sglang_patches")
MACHINE_ROOTS = ("/" + "work/",)  # spelt in two parts so that this file does not match itself


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import statement, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
    return out


def private_imports(root: Path = ROOT) -> list[str]:
    """Private names of the project's own modules (a stdlib parser module is the stdlib's business)."""
    bad = []
    for path in modules(root):
        for module, names, line in imports(path):
            if module.split(".")[0] not in PACKAGES:
                continue
            priv = [n for n in names if n.startswith("_") and not n.startswith("__")]
            parts = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
            if priv or parts:
                bad.append(f"{path.relative_to(root)}:{line}: from {module} import {', '.join(names)}")
    return bad


def checks_imports(root: Path = ROOT) -> list[str]:
    bad = []
    for path in modules(root):
        rel = path.relative_to(root)
        if rel.parts[0] == "checks":
            continue
        for module, _names, line in imports(path):
            if module == "checks" or module.startswith("checks."):
                bad.append(f"{rel}:{line}: imports {module}")
    return bad


# Where reading by name is not the safe reader's: the reader itself, and code that runs in another interpreter
# with the stdlib only (the probes, the sha256 worker) or through importlib (scan.py, after a regular-file test).
OWN_READERS = ("doctor/core/fileio.py", "doctor/model/sha256_worker.py", "doctor/stack/scan.py", "doctor/probes/")


def direct_reads(root: Path = ROOT) -> list[str]:
    """Reads of a file by name that do not go through ``doctor.core.fileio``."""
    bad = []
    for path in sorted(p for pkg in (*PACKAGES, "sglang_patches") for p in (root / pkg).rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel.startswith(OWN_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                mode = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "mode"), None)
                if not (isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax")):
                    bad.append(f"{rel}:{node.lineno}: open() for reading")
            elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
                bad.append(f"{rel}:{node.lineno}: .{func.attr}()")
            elif isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name) \
                    and func.value.id == "json":
                bad.append(f"{rel}:{node.lineno}: json.load()")
    return bad


def areas_without_package(root: Path = ROOT) -> list[str]:
    bad = []
    for pkg in ("checks", "fixes"):
        for path in sorted((root / pkg).glob("*.py")):
            if path.name == "__init__.py":
                continue
            area = path.stem
            if area.startswith("_") or not (root / "doctor" / area / "__init__.py").is_file():
                bad.append(f"{pkg}/{path.name}: no domain package doctor/{area}/")
    return bad


def test_no_module_imports_private_names() -> None:
    assert private_imports() == []


def test_fixes_and_core_never_import_checks() -> None:
    assert checks_imports() == []


def test_every_check_and_fix_module_is_an_area_with_its_package() -> None:
    assert areas_without_package() == []
    for area in [p.stem for p in (ROOT / "checks").glob("*.py") if p.stem != "__init__"]:
        assert (ROOT / "doctor" / area / "facts.py").is_file(), f"doctor/{area}/facts.py (its collectors) is missing"


def machine_paths(root: Path = ROOT) -> list[str]:
    """String constants of every Python source that name a path under a machine-specific root."""
    bad = []
    for tree_name in SOURCE_TREES:
        for path in sorted((root / tree_name).rglob("*.py")) if (root / tree_name).is_dir() else []:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and any(m in node.value for m in MACHINE_ROOTS):
                    bad.append(f"{path.relative_to(root)}:{node.lineno}: {node.value.strip()[:80]!r}")
    return bad


def test_no_input_at_a_machine_specific_path() -> None:
    assert machine_paths() == []


def test_a_machine_specific_path_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    (tmp_path / "tests" / "fixtures" / "kit.py").write_text(f"REF = {MACHINE_ROOTS[0] + 'shared/ref.json'!r}\n")
    assert machine_paths(tmp_path) == [f"tests/fixtures/kit.py:1: {MACHINE_ROOTS[0] + 'shared/ref.json'!r}"]


def test_every_file_is_read_by_the_one_safe_reader() -> None:
    assert direct_reads() == []


def test_a_direct_read_is_caught(tmp_path: Path) -> None:
    for pkg in (*PACKAGES, "sglang_patches"):
        (tmp_path / pkg).mkdir()
    (tmp_path / "doctor" / "bad.py").write_text("import json\nfrom pathlib import Path\nopen('x')\n"
                                                "Path('y').read_text()\njson.load(open('z', 'rb'))\n"
                                                "open('w', 'w')\n")
    assert direct_reads(tmp_path) == ["doctor/bad.py:3: open() for reading", "doctor/bad.py:4: .read_text()",
                                      "doctor/bad.py:5: json.load()", "doctor/bad.py:5: open() for reading"]


def test_exit_codes_and_the_writer_are_defined_once() -> None:
    exit_defs, writers = [], []
    for path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                names += [e.id for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts
                          if isinstance(e, ast.Name)]
                if any(n.startswith("EXIT_") for n in names):
                    exit_defs.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.FunctionDef) and node.name in ("atomic_write", "write_atomic"):
                writers.append(str(path.relative_to(ROOT)))
    assert sorted(set(exit_defs)) == ["doctor/core/exitcodes.py"]
    assert writers == ["doctor/core/fileio.py"]


@pytest.mark.parametrize("source, rule", [
    ("from checks.stack import _gpu_ccs\n", private_imports),
    ("from doctor.gpu import _links\n", private_imports),
])
def test_the_rules_catch_a_violation(tmp_path: Path, source: str, rule) -> None:
    """Each rule fails on the old tree's shapes (a copy with one bad module added)."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "fixes" / "bad.py").write_text(source)
    assert rule(tmp_path)


def test_checks_import_and_missing_area_are_caught(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "doctor" / "launch.py").write_text("from checks.launch import judge_flags\n")
    (tmp_path / "fixes" / "stack.py").write_text("from checks import _gpu_links as links\n")
    assert checks_imports(tmp_path) == ["doctor/launch.py:1: imports checks.launch", "fixes/stack.py:1: imports checks"]
    assert areas_without_package(tmp_path) == ["fixes/stack.py: no domain package doctor/stack/"]
    (tmp_path / "doctor" / "stack").mkdir()
    (tmp_path / "doctor" / "stack" / "__init__.py").write_text("")
    assert areas_without_package(tmp_path) == []
