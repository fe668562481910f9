"""Probe: the service interpreter's Python, its build headers, and the ML stack's installed metadata.

Runs under the service's interpreter (``doctor.core.proc.run_probe``), stdlib only, Python >= 3.8.
Imports nothing of torch/triton/sglang: versions and requirements come from ``importlib.metadata``,
package locations from ``importlib.util.find_spec`` on top-level names (which only searches
``sys.path`` and executes nothing) and from plain file reads. Prints one JSON object.
"""

import ast
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig

try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8 is not supported by the service anyway
    metadata = None
from importlib import machinery, util

# Distributions whose requirements matter to stack.versions (normalized names).
STACK = {"torch", "triton", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin",
         "flashinfer-jit-cache"}
TOP_LEVEL = ("torch", "triton", "sglang", "sgl_kernel", "flashinfer", "nvidia")
ENV_KEYS = ("CC", "PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "SGLANG_CACHE_DIR",
            "FLASHINFER_WORKSPACE_BASE",
            "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_LIBCUDA_PATH", "TRITON_CACHE_DIR", "TRITON_HOME",
            "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES")


def norm(name):
    return re.sub(r"[-_.]+", "-", name or "").lower()


def default_scheme():
    """The install scheme, exactly as triton/runtime/build.py picks it."""
    if hasattr(sysconfig, "get_default_scheme"):
        scheme = sysconfig.get_default_scheme()
    else:
        scheme = sysconfig._get_default_scheme()  # Python < 3.10
    if scheme == "posix_local":  # Debian's custom scheme; Triton maps it back
        scheme = "posix_prefix"
    return scheme


def python_facts():
    scheme = default_scheme()
    try:
        paths = sysconfig.get_paths(scheme=scheme)
    except KeyError:
        paths = sysconfig.get_paths()
    include = paths.get("include")
    platinclude = paths.get("platinclude")
    cfg = sysconfig.get_config_vars()
    return {
        "executable": sys.executable,
        "version": platform.python_version(),
        "version_info": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "exec_prefix": sys.exec_prefix,
        "base_exec_prefix": getattr(sys, "base_exec_prefix", sys.exec_prefix),
        "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "base_is_conda": os.path.isdir(os.path.join(getattr(sys, "base_prefix", sys.prefix), "conda-meta")),
        "scheme": scheme,
        "include": include,
        "platinclude": platinclude,
        "python_h": bool(include) and os.path.isfile(os.path.join(include, "Python.h")),
        "pyconfig_h": bool(platinclude) and os.path.isfile(os.path.join(platinclude, "pyconfig.h")),
        "include_listing": _listing(include),
        "ext_suffix": cfg.get("EXT_SUFFIX"),
        "build_cc": cfg.get("CC"),
        "libdir": cfg.get("LIBDIR"),
        "ldlibrary": cfg.get("LDLIBRARY"),
        "enable_shared": cfg.get("Py_ENABLE_SHARED"),
        "purelib": paths.get("purelib"),
        "platlib": paths.get("platlib"),
        "sys_path": list(sys.path),
        "markers": markers(),
    }


def _listing(path):
    """Up to 20 names in a directory, or why it cannot be listed: shows a half-present include dir."""
    if not path:
        return None
    try:
        return sorted(os.listdir(path))[:20]
    except OSError as exc:
        return "error: %s" % (exc.strerror or exc)


def markers():
    """The PEP 508 marker environment, as packaging.markers.default_environment() builds it."""
    impl = sys.implementation
    iv = impl.version
    impl_version = f"{iv.major}.{iv.minor}.{iv.micro}"
    if iv.releaselevel != "final":
        impl_version += iv.releaselevel[0] + str(iv.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": impl_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def distributions():
    """Every installed distribution's name and version; requirements for the stack's own."""
    out = {}
    duplicates = []
    errors = []
    if metadata is None:
        return out, duplicates, ["importlib.metadata unavailable"]
    for dist in metadata.distributions():
        try:
            meta = dist.metadata  # parsed once: dist.version would parse METADATA again
            name = meta["Name"]
            key = norm(name)
            if not key:
                continue
            if key in out:  # a second copy further down sys.path: the first one is what imports
                duplicates.append({"name": name, "version": meta["Version"], "shadowed_by": out[key]["version"]})
                continue
            entry = {"name": name, "version": meta["Version"]}
            location = _location(dist)
            if location:
                entry["location"] = location
            if key in STACK:
                entry["requires"] = list(dist.requires or [])
            out[key] = entry
        except Exception as exc:  # a broken METADATA file must not hide the rest
            where = getattr(dist, "_path", None)
            errors.append(f"{where or 'a distribution'}: {type(exc).__name__}: {str(exc)[:200]}")
    return out, duplicates, errors


def _location(dist):
    try:
        return str(dist.locate_file(""))
    except Exception:
        return None


def packages():
    """Where the heavy packages would be imported from, without importing them."""
    out = {}
    for name in TOP_LEVEL:
        try:
            spec = util.find_spec(name)
        except (ImportError, ValueError) as exc:
            out[name] = {"found": False, "error": f"{type(exc).__name__}: {exc}"}
            continue
        if spec is None:
            out[name] = {"found": False}
            continue
        locs = list(spec.submodule_search_locations or [])
        out[name] = {"found": True, "origin": spec.origin, "dirs": locs}
    return out


def package_dir(pkgs, name):
    """The directory ``import name`` would load, or None."""
    info = pkgs.get(name) or {}
    return info["dirs"][0] if info.get("found") and info.get("dirs") else None


def triton_facts(pkgs):
    root = package_dir(pkgs, "triton")
    if root is None:
        return None
    nv = os.path.join(root, "backends", "nvidia")
    out = {"dir": root, "bin": {}, "blackwell_ptxas_from_arch": None}
    for tool in ("ptxas", "ptxas-blackwell"):
        path = os.path.join(nv, "bin", tool)
        out["bin"][tool] = {"path": path, "exists": os.path.isfile(path), "executable": os.access(path, os.X_OK)}
    # Which ptxas Triton uses for which arch: 3.6 has `ptxas_blackwell if arch >= 100` in compiler.py.
    src = _read(os.path.join(nv, "compiler.py"))
    m = re.search(r"ptxas_blackwell\s+if\s+arch\s*>=\s*(\d+)", src or "")
    if m:
        out["blackwell_ptxas_from_arch"] = int(m.group(1))
    elif src and "ptxas_blackwell" in src:
        out["blackwell_ptxas_from_arch"] = 100
    out["build_py"] = os.path.isfile(os.path.join(root, "runtime", "build.py"))
    out["include_dir"] = os.path.join(nv, "include")
    out["cuda_h"] = os.path.isfile(os.path.join(nv, "include", "cuda.h"))
    out["lib_dir"] = os.path.join(nv, "lib")
    return out


def torch_facts(pkgs):
    root = package_dir(pkgs, "torch")
    if root is None:
        return None
    out = {"dir": root, "ptxas": None, "version_py": {}}
    ptxas = os.path.join(root, "bin", "ptxas")
    if os.path.isfile(ptxas):
        out["ptxas"] = ptxas
    # torch/version.py holds `cuda: Optional[str] = '13.0'` and `__version__ = '2.11.0+cu130'`: parsed, never
    # imported (importing torch costs seconds; this is what torch.version.cuda would say).
    text = _read(os.path.join(root, "version.py"))
    if text is None:
        out["version_py_error"] = "torch/version.py is missing or unreadable"
    else:
        values, error = version_py(text)
        out["version_py"] = values
        if error:
            out["version_py_error"] = error
    return out


VERSION_KEYS = ("__version__", "cuda", "hip", "git_version")


def version_py(text):
    """The string (or None) constants of torch/version.py, from its syntax tree: ({name: value}, error).

    A name assigned anything but a string or None (an expression torch never writes) is left out, so the
    caller cannot mistake it for "no CUDA"."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        return {}, f"torch/version.py does not parse: {exc}"
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name) or target.id not in VERSION_KEYS:
            continue
        if isinstance(value, ast.Constant) and (value.value is None or isinstance(value.value, str)):
            values[target.id] = value.value
    return values, None


def nvidia_ptxas(pkgs):
    """ptxas binaries from NVIDIA's wheels (nvidia-cuda-nvcc: nvidia/cuda_nvcc/bin or nvidia/cu13/bin)."""
    found = []
    for d in (pkgs.get("nvidia") or {}).get("dirs") or []:
        for sub in ("cuda_nvcc", "cu13", "cu12"):
            path = os.path.join(d, sub, "bin", "ptxas")
            if os.path.isfile(path):
                found.append(path)
    return found


def sglang_jit(pkgs):
    """SGLang >= 0.5.2x builds its JIT kernels (DFlash tree sampling among them) with nvcc at first use,
    found as tvm-ffi finds it: CUDA_HOME / CUDA_PATH, then nvcc on PATH, then /usr/local/cuda."""
    root = package_dir(pkgs, "sglang")
    if root is None or not os.path.isdir(os.path.join(root, "kernels", "jit")):
        return None
    return find_nvcc()


@functools.lru_cache(maxsize=None)  # noqa: UP033 - functools.cache is 3.9+; probes run on 3.8
def find_nvcc():
    """The nvcc a JIT build runs, found as tvm-ffi and FlashInfer find it (flashinfer/jit/cpp_ext.py
    get_cuda_path): CUDA_HOME / CUDA_PATH, then nvcc on PATH, then /usr/local/cuda. Once per probe: SGLang's
    and FlashInfer's JIT facts share the one ``nvcc --version`` run."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    how = "CUDA_HOME/CUDA_PATH"
    if home is None:
        found = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(found)) if found else "/usr/local/cuda"
        how = "PATH" if found else "default /usr/local/cuda"
    nvcc = os.path.join(home, "bin", "nvcc")
    out = {"nvcc": nvcc, "found_by": how, "exists": os.path.isfile(nvcc), "release": None, "home": home}
    out.update(cuda_headers(home, nvcc))
    if out["exists"]:
        try:
            text = subprocess.run([nvcc, "--version"], capture_output=True, timeout=20, check=False).stdout
            m = re.search(r"release (\d+\.\d+)", text.decode(errors="replace"))
            out["release"] = m.group(1) if m else None
        except (OSError, subprocess.SubprocessError) as exc:
            out["error"] = str(exc)
    return out


HEADER_MACROS = (("cudart_version", "cuda_runtime_api.h", "CUDART_VERSION"), ("cuda_version", "cuda.h", "CUDA_VERSION"))


def nvcc_includes(nvcc):
    """The include directories nvcc adds itself: the ``-I`` entries of the ``nvcc.profile`` beside the real
    binary (``INCLUDES += "-I$(TOP)/include"``, ``TOP = $(_HERE_)/..``; a full toolkit's ``$(_TARGET_DIR_)``),
    or None where there is no profile (a wrapper script: what it runs is not known here)."""
    here = os.path.dirname(os.path.realpath(nvcc))
    text = _read(os.path.join(here, "nvcc.profile"), 100000)
    if text is None:
        return None
    target = "targets/%s-linux" % ("x86_64" if platform.machine() == "x86_64" else "sbsa")
    m = re.search(r"^[ \t]*TOP[ \t]*=[ \t]*(\S+)", text, re.M)
    top = (m.group(1) if m else "$(_HERE_)/..").replace("$(_HERE_)", here)
    out = []
    for line in re.findall(r"^[ \t]*INCLUDES[ \t]*\+?=(.*)$", text, re.M):
        for inc in re.findall(r'-I"?([^"\s]+)', line):
            inc = inc.replace("$(TOP)", top).replace("$(_HERE_)", here).replace("$(_TARGET_DIR_)", target)
            out.append(os.path.normpath(inc))
    return out


def cuda_headers(home, nvcc):
    """The CUDA headers a JIT build includes: nvcc's own ``-I`` directories first (its ``nvcc.profile``), then
    ``<home>/include``, where FlashInfer's and tvm-ffi's builds point ``-isystem``. Whether ``cuda_runtime.h``
    is there (None where nvcc is a wrapper and ``<home>/include`` lacks it: not known), and the release macros
    of the first ``cuda_runtime_api.h`` (``CUDART_VERSION``, what CCCL's cuda_toolkit.h compares with nvcc's
    release) and ``cuda.h``."""
    own = nvcc_includes(nvcc) if os.path.isfile(nvcc) else None
    dirs = list(dict.fromkeys((own or []) + [os.path.normpath(os.path.join(home, "include"))]))
    has = [d for d in dirs if os.path.isfile(os.path.join(d, "cuda_runtime.h"))]
    include = next((d for d in dirs if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))), dirs[0])
    out = {"include": include, "includes": dirs,
           "cuda_runtime_h": True if has else (False if own is not None else None)}
    for key, name, macro in HEADER_MACROS:
        path = os.path.join(include, name)
        text = _read(path, 4000000) if os.path.isfile(path) else None
        m = re.search(r"^[ \t]*#[ \t]*define[ \t]+" + macro + r"[ \t]+(\d+)", text or "", re.M)
        out[key] = int(m.group(1)) if m else None
    return out


def flashinfer_jit(pkgs, dists):
    """What FlashInfer needs to build its JIT modules when a server first calls them (DFLASH/DDTREE's
    sampling rehearsal at start): an AOT ``flashinfer-jit-cache`` of the same version (in ``distributions``),
    or modules already compiled in the cache, or else nvcc, ``ninja`` on PATH and a writable cache. The cache
    is where SGLang points it (sglang/srt/environ.py third_party_cache_defaults: ``FLASHINFER_WORKSPACE_BASE``, else
    ``SGLANG_CACHE_DIR``, else ``~/.cache/sglang``; FlashInfer adds ``.cache/flashinfer/<version>/<archs>``)."""
    if package_dir(pkgs, "flashinfer") is None:
        return None
    version = (dists.get("flashinfer-python") or {}).get("version")
    env = os.environ
    if env.get("FLASHINFER_WORKSPACE_BASE"):
        base, base_from = env["FLASHINFER_WORKSPACE_BASE"], "FLASHINFER_WORKSPACE_BASE"
    elif env.get("SGLANG_CACHE_DIR"):
        base, base_from = os.path.expanduser(env["SGLANG_CACHE_DIR"]), "SGLANG_CACHE_DIR"
    else:
        base, base_from = os.path.expanduser("~/.cache/sglang"), "SGLang's default ~/.cache/sglang"
    cache = os.path.join(base, ".cache", "flashinfer")
    compiled = []
    vdir = os.path.join(cache, version or "")
    try:
        archs = sorted(os.listdir(vdir)) if version and os.path.isdir(vdir) else []
    except OSError:
        archs = []
    for arch in archs[:64]:
        ops = os.path.join(vdir, arch, "cached_ops")
        try:
            names = sorted(os.listdir(ops))[:256] if os.path.isdir(ops) else []
        except OSError:
            names = []
        compiled += [f"{arch}/{n}" for n in names if os.path.isfile(os.path.join(ops, n, n + ".so"))]
    probe = cache
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    beside = os.path.join(os.path.dirname(sys.executable), "ninja")
    return {"version": version, "cache_dir": cache, "base_from": base_from,
            "compiled": compiled, "writable": os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK),
            "writable_checked": probe, "ninja": shutil.which("ninja"),
            "ninja_beside_python": beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None,
            "nvcc": find_nvcc()}


def _read(path, limit=2000000):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def find_module(dotted):
    """Where ``import dotted`` would load from, executing nothing: the top-level package by
    ``find_spec`` (which only searches ``sys.path``), then each submodule in its parent's directories as
    the path finder looks (a package directory with ``__init__``, a module file, else a namespace
    portion). ``find_spec("a.b")`` itself would import ``a``, which for FlashInfer means torch."""
    parts = dotted.split(".")
    try:
        spec = util.find_spec(parts[0])
    except (ImportError, ValueError) as exc:  # a broken finder (.pth hook) is reported, not raised
        return {"found": False, "error": f"{type(exc).__name__}: {exc}"}
    if spec is None:
        return {"found": False, "error": f"ModuleNotFoundError: No module named {parts[0]!r}"}
    dirs = list(spec.submodule_search_locations or [])
    out = {"found": False, "package_dir": dirs[0] if dirs else None}
    where = spec.origin
    suffixes = machinery.all_suffixes()
    for i, part in enumerate(parts[1:], 1):
        if not dirs:
            out["error"] = (f"ModuleNotFoundError: No module named {'.'.join(parts[:i + 1])!r}; "
                            f"{'.'.join(parts[:i])!r} is not a package")
            return out
        where, portions = None, []
        for d in dirs:
            pkg = os.path.join(d, part)
            init = [f for f in (os.path.join(pkg, "__init__" + x) for x in suffixes) if os.path.isfile(f)]
            if init:
                where, portions = init[0], [pkg]
                break
            mod = [f for f in (os.path.join(d, part + x) for x in suffixes) if os.path.isfile(f)]
            if mod:
                where, portions = mod[0], []
                break
            if os.path.isdir(pkg):
                portions.append(pkg)  # a namespace portion: used only if nothing else is found
        if where is None and not portions:
            out["error"] = f"ModuleNotFoundError: No module named {'.'.join(parts[:i + 1])!r}"
            return out
        where, dirs = where or portions[0], portions
    out["found"] = True
    out["file"] = where
    return out


def sglang_runtime(pkgs, rules):
    """What a server imports at start beyond ``import sglang`` (doctor/data/sglang_runtime.toml, passed as
    ``rules``), found on disk: each rule's module (and the directories FlashInfer's JIT compiles from),
    and the files DFlash's sampling verify needs. Nothing is imported; ``--deep`` imports for real."""
    root = package_dir(pkgs, "sglang")
    if root is None or not isinstance(rules, dict):
        return None
    out = {"from": "files"}
    for name, rule in sorted((rules.get("modules") or {}).items()):
        found = find_module(rule["module"])
        found["module"] = rule["module"]
        top = found.get("package_dir")
        if rule.get("dirs") and top:
            found["jit_dirs"] = {d: os.path.isdir(os.path.join(top, d)) for d in rule["dirs"]}
        out[name] = found
    dflash = rules.get("dflash")
    if isinstance(dflash, dict):
        files = {k: os.path.isfile(os.path.join(root, v)) for k, v in sorted(dflash.items())}
        entry = {"module": "sglang.srt.speculative.dflash_utils", "files": files}
        if not files.get("utils"):
            entry.update(available=None, error=f"this SGLang has no {dflash.get('utils')}")
        elif not files.get("selector"):
            entry.update(available=None, error=(f"no {dflash.get('selector')}: the kernel's layout is unknown to "
                                                  "this doctor (--deep imports SGLang to ask)"))
        else:
            entry["available"] = bool(files.get("kernel"))
        out["dflash"] = entry
    return out


def main():
    rules = None
    if len(sys.argv) > 2 and sys.argv[1] == "--sglang-runtime":
        try:
            rules = json.loads(sys.argv[2])
        except ValueError:
            rules = None
    pkgs = packages()
    dists, duplicates, errors = distributions()
    doc = {
        "ok": True,
        "python": python_facts(),
        "distributions": dists,
        "duplicates": duplicates,
        "metadata_errors": errors,
        "packages": pkgs,
        "triton": triton_facts(pkgs),
        "torch": torch_facts(pkgs),
        "nvidia_ptxas": nvidia_ptxas(pkgs),
        "sglang_jit": sglang_jit(pkgs),
        "flashinfer_jit": flashinfer_jit(pkgs, dists),
        "sglang_runtime": sglang_runtime(pkgs, rules),
        "env": {k: os.environ.get(k) for k in ENV_KEYS if os.environ.get(k) is not None},
    }
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
