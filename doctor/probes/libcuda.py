"""Probe: which libcuda.so.1 the dynamic loader gives the service, and every other one it could find.

Run by ``doctor.core.proc.run_probe`` under the service's ``--python`` with the service's environment
(``LD_LIBRARY_PATH`` included): ``ctypes.CDLL("libcuda.so.1")`` is exactly the lookup torch and
Triton make, and ``/proc/self/maps`` then names the file it mapped. The library's version comes from
its real file name (``libcuda.so.580.159.04``); ``cuDriverGetVersion`` (no initialisation needed)
gives the CUDA version it implements; ``cuInit(0)`` gives the verdict the driver itself returns
(803: user-mode driver and kernel module do not match; 804: forward compatibility on a GPU that does
not support it). The kernel module's version is read from ``/proc/driver/nvidia/version``.

The other candidates: each ``LD_LIBRARY_PATH`` directory, the loader cache (``ldconfig -p``) with the
``/etc/ld.so.conf`` file that names each directory, and the CUDA forward-compatibility directories
(``/usr/local/cuda*/compat``). Stdlib only, Python >= 3.8. Prints one JSON object on the last line.

    python libcuda.py [--proc-version PATH] [--no-init]
"""

import ctypes
import glob
import json
import os
import re
import subprocess
import sys

VERSION = re.compile(r"libcuda\.so\.(\d+(?:\.\d+)+)$")
KMD = re.compile(r"Kernel Module(?: for [^ ]+)?\s+(\d+(?:\.\d+)+)")
COMPAT_GLOBS = ("/usr/local/cuda/compat", "/usr/local/cuda-*/compat", "/usr/local/cuda/compat/lib*",
                "/usr/local/cuda-*/compat/lib*")


def file_version(path):
    """The driver version a libcuda file carries in its real name, or None."""
    m = VERSION.search(os.path.basename(os.path.realpath(path)))
    return m.group(1) if m else None


def describe(path):
    real = os.path.realpath(path)
    return {"path": path, "realpath": real, "version": file_version(path), "exists": os.path.exists(real)}


def kernel_module(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except OSError as exc:
        return {"path": path, "present": False, "error": exc.strerror or str(exc)}
    m = KMD.search(text)
    first = text.splitlines()[0] if text else ""
    return {"path": path, "present": True, "version": m.group(1) if m else None, "text": first[:300],
            "open": "Open Kernel Module" in first}


def mapped_libcuda():
    """The libcuda file this process has mapped, from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and re.search(r"/libcuda\.so[^/]*$", parts[5].strip()):
                    return parts[5].strip()
    except OSError:
        return None
    return None


def load(init):
    out = {"loaded": False}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = str(exc)
        return out
    out["loaded"] = True
    path = mapped_libcuda()
    if path:
        out.update(describe(path))
    version = ctypes.c_int(0)
    try:
        rc = lib.cuDriverGetVersion(ctypes.byref(version))
        out["driver_get_version"] = {"rc": rc, "cuda": version.value}
    except (AttributeError, OSError) as exc:
        out["driver_get_version"] = {"error": str(exc)}
    if init:
        try:
            out["cu_init"] = lib.cuInit(0)
        except (AttributeError, OSError) as exc:
            out["cu_init_error"] = str(exc)
    return out


def ld_so_conf(root="/etc/ld.so.conf"):
    """Directory -> the ld.so.conf file that lists it (following ``include`` lines)."""
    found = {}
    seen = set()

    def read(path):
        if path in seen or len(seen) > 200:
            return
        seen.add(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read(65536).splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include "):
                pattern = line.split(None, 1)[1].strip()
                if not os.path.isabs(pattern):
                    pattern = os.path.join(os.path.dirname(path), pattern)
                for inc in sorted(glob.glob(pattern)):
                    read(inc)
            else:
                found.setdefault(os.path.normpath(line), path)

    read(root)
    return found


def ldconfig_cache():
    """``libcuda.so.1`` entries of the loader cache, in the order the loader tries them."""
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            res = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        out = []
        for line in res.stdout.splitlines():
            m = re.match(r"\s*libcuda\.so\.1 \(([^)]*)\) => (\S+)", line)
            if m:
                out.append(m.group(2))
        return out
    return None


def main():
    args = sys.argv[1:]
    proc_version = "/proc/driver/nvidia/version"
    if "--proc-version" in args:
        proc_version = args[args.index("--proc-version") + 1]
    ld_path = os.environ.get("LD_LIBRARY_PATH", "")
    conf = ld_so_conf()
    cache = ldconfig_cache()
    doc = {
        "ok": True,
        "python": sys.executable,
        "kernel_module": kernel_module(proc_version),
        "ld_library_path": ld_path,
        "resolved": load("--no-init" not in args),
        "ld_library_path_candidates": [dict(describe(os.path.join(d, "libcuda.so.1")), dir=d)
                                       for d in ld_path.split(os.pathsep)
                                       if d and os.path.exists(os.path.join(d, "libcuda.so.1"))],
        "ldconfig": None if cache is None else [dict(describe(p), conf=conf.get(os.path.dirname(p)))
                                                for p in cache],
        "compat_dirs": [dict(describe(os.path.join(d, "libcuda.so.1")), dir=d)
                        for pattern in COMPAT_GLOBS for d in sorted(glob.glob(pattern))
                        if os.path.exists(os.path.join(d, "libcuda.so.1"))],
        "ld_so_conf": {d: f for d, f in conf.items() if "cuda" in d or "nvidia" in d},
    }
    sys.stdout.write(json.dumps(doc) + "\n")


if __name__ == "__main__":
    main()
