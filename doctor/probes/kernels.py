"""Probe: the GPU code and libtorch ABI of every package the service's interpreter has, read from the files.

Run by ``doctor.core.proc.run_probe`` under the service's ``--python``: its ``importlib.metadata`` sees
exactly the distributions the service imports from. Nothing of theirs is imported or loaded; the
scan (``doctor/stack/scan.py``) only reads ELF and fat binary headers, so this doctor's ``stack``
package is put first on ``sys.path`` for this process alone (stdlib only, Python >= 3.8).

    python kernels.py [SITE_DIR ...]     (default: the interpreter's sys.path)

Prints one JSON object on the last line.
"""

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    start = time.monotonic()
    sys.path.insert(0, ROOT)
    try:
        from doctor.stack import scan
    except Exception as exc:  # the doctor's own files unreadable, or a Python too old for them
        print(json.dumps({"ok": False, "error": f"cannot load the scanner from {ROOT}: {type(exc).__name__}: {exc}"}))
        return
    finally:
        sys.path.remove(ROOT)  # the doctor's own location is not one the service imports from
    paths = sys.argv[1:] or None
    out = scan.scan(paths)
    out["python"] = sys.executable
    out["sys_path"] = [p for p in sys.path if p]
    out["probe_s"] = round(time.monotonic() - start, 3)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
