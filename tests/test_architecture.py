"""The layering rules of DEVELOPING.md, read from the sources' AST (the folder listing is the architecture).

1. No module imports another module's private (underscore) names.
2. ``fixes/`` and ``doctor/`` never import ``checks``.
3. Every ``checks/<area>.py`` and ``fixes/<area>.py`` has its domain package ``doctor/<area>/``.
4. One exit-code module and one crash-safe writer.
5. No input looked for at a machine-specific absolute path (the machine the project is built on keeps its
   shared files under ``/work``): what the code and the tests read is in the repository.
6. One safe reader: no module reads a file by name itself (``open()`` for reading, ``Path.read_text``,
   ``Path.read_bytes``, ``json.load``); ``doctor.core.fileio`` does (a FIFO never blocks, sizes are capped).
7. The core imports nothing above it: no area, no ``doctor.app``, ``doctor.report``, ``doctor.commands``,
   ``doctor.facts``, ``doctor.service``, ``doctor.cli``, no click.
8. Every collector declares the shape of its fact (``@collector(..., shape=...)``).
9. One finding type: no class outside ``doctor/core/result.py`` is a finding (named ``*Finding``, ``*Verdict``,
   ``*Problem``, or holding a severity or status with a message or summary).
10. One exit point: ``sys.exit`` only in ``doctor.cli.main`` and in the ``__main__`` block of a program the doctor
   runs as a child process (probes, workers).
11. Checks only map facts to their area's judgements: ``checks/`` builds results only from findings
    (``Result.of``), never reads the fact store itself, keeps its functions small (mean cyclomatic complexity <= 8,
    none over 60 lines: radon).
12. No upward import: the areas stand in layers (``AREA_LAYERS``) and an area's package imports only areas of a
    lower layer, and nothing above the areas (the service, reports, commands, the app); a new area declares its
    layer. (The product's complexity budget is ``tests/test_complexity.py``.)
13. Facts are facts: a collector's module (``doctor/<area>/facts.py``) and the readers whose output a fact records
    (``FACT_READERS``: the model's header, index and weights scan) make no finding: they import nothing from
    ``doctor.core.result``. What they find wrong is recorded as data; the area's judgement words and weighs it.
14. The profile is read typed: no dotted string lookup of a schema table (``settings.get("server.port")``): its
    keys are attributes of the tables generated from the schema (``settings.server.port``, ``doctor/core/profile.py``).
15. The server's planned argv is the run's (``Context.server_args``, computed once by ``doctor.app``): ``checks/``
    never import ``doctor.service.launcher``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("doctor", "checks", "fixes")
ABOVE_CORE = ("doctor.app", "doctor.report", "doctor.commands", "doctor.facts", "doctor.service", "doctor.cli",
              "click", "checks", "fixes")
FINDING_NAMES = ("Finding", "Findings", "Verdict", "Problem")
CHILD_PROGRAMS = ("doctor/probes/", "doctor/facts/worker.py", "doctor/model/sha256_worker.py",
                  "doctor/service/diagnose_worker.py")
ONE_STEP_RESULTS = ("passed", "warned", "failed", "not_judged", "skipped", "errored", "blocked")
SOURCE_TREES = (*PACKAGES, "tests", "bench", "scripts", "tools", "sglang_patches")
MACHINE_ROOTS = ("/" + "work/",)  # spelt in two parts so that this file does not match itself
# The areas' layers, lowest first: an area imports only areas of a lower layer (what two areas share lives below
# both: the SGLang releases' flag table in doctor.stack, read by gpu.multicast and the sglang area).
AREA_LAYERS = {"host": 0, "python": 1, "model": 1, "stack": 1, "gpu": 2, "triton": 2, "sglang": 3}
# The readers a collector records as they are (besides every doctor/<area>/facts.py): what they find wrong is data.
FACT_READERS = ("doctor/model/header.py", "doctor/model/index.py", "doctor/model/scan.py",
                "doctor/model/shard_work.py", "doctor/model/layout.py")
ABOVE_AREAS = ("doctor.service", "doctor.report", "doctor.commands", "doctor.app", "doctor.cli")


@functools.cache
def _parsed(text: str, filename: str) -> tuple[ast.Module, tuple[ast.AST, ...]]:
    tree = ast.parse(text, filename)
    return tree, tuple(ast.walk(tree))


def parsed(path: Path) -> ast.Module:
    """The AST of ``path``, parsed once per content: every rule reads the same few hundred files (none changes
    a tree)."""
    return _parsed(path.read_text(encoding="utf-8"), str(path))[0]


def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``parsed(path)`` in ``ast.walk``'s order, walked once per content."""
    return _parsed(path.read_text(encoding="utf-8"), str(path))[1]


def modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import statement, nested ones included."""
    out = []
    for node in nodes(path):
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
        for node in nodes(path):
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


def areas(root: Path = ROOT) -> list[str]:
    """The area packages: ``doctor/<area>/`` with its collectors (``facts.py``)."""
    return sorted(p.parent.name for p in (root / "doctor").glob("*/facts.py") if p.parent.name != "facts")


def core_imports(root: Path = ROOT) -> list[str]:
    """Imports of the core that reach above it: an area, the app, reports, commands, facts, service, click."""
    above = ABOVE_CORE + tuple(f"doctor.{a}" for a in areas(root))
    bad = []
    for path in sorted((root / "doctor" / "core").rglob("*.py")):
        for module, _names, line in imports(path):
            if any(module == a or module.startswith(a + ".") for a in above):
                bad.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return bad


def decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""


def collectors_without_shape(root: Path = ROOT) -> list[str]:
    bad = []
    for path in modules(root):
        for node in nodes(path):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if decorator_name(dec) == "collector" and not (
                            isinstance(dec, ast.Call) and any(k.arg == "shape" for k in dec.keywords)):
                        bad.append(f"{path.relative_to(root)}:{node.lineno}: collector {node.name} declares no shape")
    return bad


def finding_types(root: Path = ROOT) -> list[str]:
    """Classes outside doctor/core/result.py that are findings by name or by what they hold."""
    bad = []
    for path in modules(root):
        rel = path.relative_to(root).as_posix()
        if rel == "doctor/core/result.py":
            continue
        for node in nodes(path):
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            held = bool(fields & {"severity", "status"}) and bool(fields & {"message", "summary"})
            if node.name.endswith(FINDING_NAMES) or held:
                bad.append(f"{rel}:{node.lineno}: class {node.name}")
    return bad


def in_main_block(tree: ast.Module, node: ast.AST) -> bool:
    for top in tree.body:
        if (isinstance(top, ast.If) and "__name__" in ast.unparse(top.test) and "__main__" in ast.unparse(top.test)
                and any(n is node for n in ast.walk(top))):
            return True
    return False


def exits(root: Path = ROOT) -> list[str]:
    """``sys.exit`` (and ``exit``/``quit``) outside ``doctor.cli.main`` and child programs' ``__main__`` blocks."""
    bad = []
    for path in modules(root):
        rel = path.relative_to(root).as_posix()
        tree = parsed(path)
        main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"] if rel == "doctor/cli.py" \
            else []
        for node in nodes(path):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "quit")):
                continue
            if any(node in ast.walk(m) for m in main):
                continue
            if rel.startswith(CHILD_PROGRAMS) and in_main_block(tree, node):
                continue
            bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return bad


def check_shortcuts(root: Path = ROOT) -> list[str]:
    """What a check does beyond mapping facts to its area's judgements: a result made in one step
    (``Result.failed(...)``: the judgement belongs in the area, with findings) or a read of the fact store itself
    (``ctx.facts``: facts are read through ``ctx.fact``, which holds the check to its declaration)."""
    bad = []
    for path in sorted((root / "checks").glob("*.py")):
        found = []
        for node in nodes(path):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "Result" and node.attr in ONE_STEP_RESULTS:
                    found.append((node.lineno, f"Result.{node.attr}"))
                if node.attr == "facts":
                    found.append((node.lineno, f"{node.value.id}.facts"))
        bad += [f"{path.relative_to(root)}:{line}: {what}" for line, what in sorted(found)]
    return bad


def complexity(root: Path = ROOT) -> tuple[float, list[str]]:
    """checks/: the mean cyclomatic complexity of its blocks (radon) and its functions over 60 lines."""
    from radon.complexity import cc_visit

    blocks, long = [], []
    for path in sorted((root / "checks").glob("*.py")):
        for block in cc_visit(path.read_text(encoding="utf-8")):
            blocks.append(block.complexity)
            if block.endline - block.lineno + 1 > 60:
                long.append(f"{path.relative_to(root)}:{block.lineno}: {block.name} "
                            f"({block.endline - block.lineno + 1} lines)")
    return (sum(blocks) / len(blocks) if blocks else 0.0), long


def test_the_core_imports_nothing_above_it() -> None:
    assert core_imports() == []


def test_every_collector_declares_its_shape() -> None:
    assert collectors_without_shape() == []


def test_one_finding_type() -> None:
    assert finding_types() == []


def test_one_exit_point() -> None:
    assert exits() == []


def test_checks_only_map_facts_to_judgements() -> None:
    assert check_shortcuts() == []


def test_checks_are_small() -> None:
    mean, long = complexity()
    assert long == []
    assert mean <= 8, f"checks/ mean cyclomatic complexity {mean:.1f} > 8"


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
            for node in nodes(path):
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
        for node in nodes(path):
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


def test_the_new_rules_catch_their_violations(tmp_path: Path) -> None:
    """Each rule fails on the shape it forbids (a tree with one bad module of each kind)."""
    for pkg in (*PACKAGES, "doctor/core", "doctor/gpu", "doctor/probes"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "doctor" / "gpu" / "facts.py").write_text(
        "from doctor.core.registry import collector\n\n@collector('nvml')\ndef nvml(opts):\n    return {}\n")
    (tmp_path / "doctor" / "core" / "fixing.py").write_text("import click\nfrom doctor.app import run\n"
                                                            "from doctor.gpu import fabric\n")
    (tmp_path / "doctor" / "gpu" / "verdict.py").write_text("class Verdict:\n    pass\n\n"
                                                           "class Said:\n    status: str\n    summary: str\n")
    (tmp_path / "doctor" / "gpu" / "tool.py").write_text("import sys\n\ndef go():\n    sys.exit(2)\n")
    (tmp_path / "doctor" / "probes" / "p.py").write_text("import sys\n\nif __name__ == '__main__':\n    sys.exit(0)\n")
    (tmp_path / "checks" / "gpu.py").write_text("def check(ctx):\n    ctx.facts.get('nvml')\n"
                                                "    return Result.failed('x')\n")
    assert core_imports(tmp_path) == ["doctor/core/fixing.py:1: imports click", "doctor/core/fixing.py:2: imports "
                                      "doctor.app", "doctor/core/fixing.py:3: imports doctor.gpu"]
    assert collectors_without_shape(tmp_path) == ["doctor/gpu/facts.py:4: collector nvml declares no shape"]
    assert finding_types(tmp_path) == ["doctor/gpu/verdict.py:1: class Verdict", "doctor/gpu/verdict.py:4: class Said"]
    assert exits(tmp_path) == ["doctor/gpu/tool.py:4: sys.exit(2)"]
    assert check_shortcuts(tmp_path) == ["checks/gpu.py:2: ctx.facts", "checks/gpu.py:3: Result.failed"]


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


def upward_imports(root: Path = ROOT) -> list[str]:
    """Imports of an area's package that climb: into an area of the same or a higher layer (``AREA_LAYERS``), or
    above the areas. An area without a declared layer is named."""
    known = areas(root)
    bad = [f"doctor/{a}: no layer in AREA_LAYERS" for a in known if a not in AREA_LAYERS]
    for area in known:
        for path in sorted((root / "doctor" / area).rglob("*.py")):
            for module, _names, line in imports(path):
                parts = module.split(".")
                target = parts[1] if parts[0] == "doctor" and len(parts) > 1 else None
                climbs = target in known and target != area and \
                    AREA_LAYERS.get(target, 99) >= AREA_LAYERS.get(area, -1)
                if climbs or any(module == a or module.startswith(a + ".") for a in ABOVE_AREAS):
                    bad.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return bad


def test_no_area_imports_upward() -> None:
    assert upward_imports() == []


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    for area in ("gpu", "sglang", "stack"):
        (tmp_path / "doctor" / area).mkdir(parents=True)
        (tmp_path / "doctor" / area / "facts.py").write_text("")
    (tmp_path / "doctor" / "gpu" / "multicast.py").write_text("from doctor.sglang.flag_history import load_history\n"
                                                              "from doctor.stack.sglang_releases import load_history\n")
    (tmp_path / "doctor" / "stack" / "probe.py").write_text("def f():\n    from doctor.service import launcher\n")
    (tmp_path / "doctor" / "odd").mkdir()
    (tmp_path / "doctor" / "odd" / "facts.py").write_text("")
    assert upward_imports(tmp_path) == ["doctor/odd: no layer in AREA_LAYERS",
                                        "doctor/gpu/multicast.py:1: imports doctor.sglang.flag_history",
                                        "doctor/stack/probe.py:2: imports doctor.service"]


def judging_collectors(root: Path = ROOT) -> list[str]:
    """Collector modules and fact readers that import from ``doctor.core.result`` (a finding made while collecting:
    a replayed snapshot would keep the rules it was recorded with)."""
    paths = sorted({*(root / "doctor").glob("*/facts.py"), *(root / r for r in FACT_READERS)})
    return [f"{path.relative_to(root)}:{line}: imports {', '.join(names) or module}"
            for path in paths if path.is_file() and path.parent.name != "facts"
            for module, names, line in imports(path) if module == "doctor.core.result"]


def test_collectors_record_facts_and_judge_nothing() -> None:
    assert judging_collectors() == []


def test_a_judging_collector_is_caught(tmp_path: Path) -> None:
    (tmp_path / "doctor" / "model").mkdir(parents=True)
    (tmp_path / "doctor" / "model" / "facts.py").write_text("from doctor.core.result import Findings\n")
    (tmp_path / "doctor" / "model" / "header.py").write_text("def f():\n    from doctor.core.result import Finding\n")
    (tmp_path / "doctor" / "model" / "weights.py").write_text("from doctor.core.result import Findings\n")
    assert judging_collectors(tmp_path) == ["doctor/model/facts.py:1: imports Findings",
                                            "doctor/model/header.py:2: imports Finding"]


def schema_tables() -> tuple[str, ...]:
    from doctor.core.profile import TABLES

    return TABLES


def dotted_lookups(root: Path = ROOT) -> list[str]:
    """``X.get("table.key", ...)`` where ``table`` is a table of the schema (or the receiver is the settings), the
    key a string or an f-string: the profile read by string instead of through its typed tables."""
    prefixes = tuple(f"{t}." for t in schema_tables())
    bad = []
    for path in modules(root):
        for node in nodes(path):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args):
                continue
            first = node.args[0]
            head = first.value if isinstance(first, ast.Constant) else (
                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                and isinstance(first.values[0], ast.Constant) else None)
            if not isinstance(head, str) or "." not in head:
                continue
            if head.startswith(prefixes) or ast.unparse(node.func.value).endswith("settings"):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def launcher_imports(root: Path = ROOT) -> list[str]:
    """Imports of ``doctor.service.launcher`` by a check module (the planned argv is ``ctx.server_args``)."""
    bad = []
    for path in sorted((root / "checks").glob("*.py")):
        for module, names, line in imports(path):
            if module == "doctor.service.launcher" or (module == "doctor.service" and "launcher" in names):
                bad.append(f"{path.relative_to(root)}:{line}: imports doctor.service.launcher")
    return bad


def test_the_profile_is_read_through_its_typed_tables() -> None:
    assert dotted_lookups() == []


def test_checks_read_the_planned_argv_from_the_run() -> None:
    assert launcher_imports() == []


def test_a_dotted_lookup_and_a_launcher_import_are_caught(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "doctor" / "gpu.py").write_text(
        "def f(settings, s, params, role):\n    a = settings.get('server.port', 30000)\n"
        "    b = s.get(f'stack.{role}')\n    c = params.get('iommu.passthrough')\n"
        "    d = settings.get(role.repo_key)\n    return s.server.port\n")
    (tmp_path / "checks" / "host.py").write_text("from doctor.service.launcher import planned_args\n"
                                                 "from doctor.service import launcher, readiness\n")
    (tmp_path / "checks" / "gpu.py").write_text("from doctor.service import readiness\n")
    assert dotted_lookups(tmp_path) == ["doctor/gpu.py:2: settings.get('server.port', 30000)",
                                        "doctor/gpu.py:3: s.get(f'stack.{role}')"]
    assert launcher_imports(tmp_path) == ["checks/host.py:1: imports doctor.service.launcher",
                                          "checks/host.py:2: imports doctor.service.launcher"]
