"""Free space and writability where the service writes (host.disk): the Triton cache, TMPDIR, the profile's
[host] paths. A full or read-only disk shows up minutes into a start as an obscure compile or write error; a path
the service's user cannot write needs a chown/chmod, never "free space"."""

from __future__ import annotations

import shlex
from typing import Any

from doctor.core.result import Findings, Remediation
from doctor.core.settings import Settings
from doctor.host.access import access_fix, describe

GIB = 1024**3


class DiskReading:
    """Per location: its line for the details, and what is wrong (not writable, too little free space)."""

    def __init__(self, disk: dict[str, Any], need: float) -> None:
        self.bad: list[str] = []
        self.warn: list[str] = []
        self.rows: dict[str, str] = {}
        self.denied: list[dict[str, Any]] = []
        self.user: Any = None
        seen_fs: set[str] = set()
        for name, e in disk.items():
            if "error" in e:
                self.bad.append(f"{e.get('path')}: {e['error']}")
                continue
            self.read(name, e, need, seen_fs)

    def read(self, name: str, e: dict[str, Any], need: float, seen_fs: set[str]) -> None:
        free = e["free_bytes"]
        self.rows[name] = f"{e['path']}: {free / GIB:.1f} GiB free" + ("" if e["writable"] else " (not writable)")
        if e.get("read_only_fs") or not e["writable"]:
            access = e.get("access")
            if access and not e.get("read_only_fs"):
                self.denied.append(dict(access, target=e["path"]))
                self.user = self.user or e.get("user")
            self.bad.append(f"{e['path']} is not writable" + (" (read-only filesystem)" if e.get("read_only_fs") else
                                                              f" ({describe(access)})" if access else ""))
        elif free < need and e["measured_at"] not in seen_fs:
            self.bad.append(f"{e['path']}: {free / GIB:.1f} GiB free < {need / GIB:g} GiB")
        elif free < 2 * need:
            self.warn.append(f"{e['path']}: {free / GIB:.1f} GiB free")
        seen_fs.add(e["measured_at"])


def judge_disk(disk: dict[str, Any], settings: Settings) -> Findings:
    need = float(settings.host.min_free_gib) * GIB
    seen = DiskReading(disk, need)
    out = Findings(paths=seen.rows)
    if seen.bad:
        out.details["access"] = seen.denied
        if seen.denied and len(seen.denied) == len(seen.bad):  # only permissions: a chown/chmod, never "free space"
            return out.fail("host.disk.not_writable", "; ".join(seen.bad), access_fix(seen.denied, "write", seen.user))
        df = shlex.join(["df", "-h", *sorted({str(e["path"]) for e in disk.values()})])
        rem = Remediation("Free space or point the cache elsewhere (TRITON_CACHE_DIR, TMPDIR) in the service's "
                          "environment file.", [df])
        if seen.denied:
            fix = access_fix(seen.denied, "write", seen.user)
            rem = Remediation(rem.text + " " + fix.text, rem.commands + fix.commands)
        return out.fail("host.disk.full", "; ".join(seen.bad), rem)
    if seen.warn:
        out.details["min_free_gib"] = need / GIB
        return out.warn("host.disk.low", "low space: " + "; ".join(seen.warn))
    return out.info("host.disk.free", f"{len(disk)} locations writable, >= {need / GIB:g} GiB free each")
