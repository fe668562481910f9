"""Who may read or write a path: its owner, group and mode, and the exact chmod/chown that fixes access;
what another user (the service's) may reach, computed from the bits, never asked of ``os.access`` (as root
the doctor would always be let through).

Permission problems are not damage: a shard that the service's user cannot read needs a chmod or a
chown, never a download. Facts record the owner and mode (``ownership``) next to the error; checks turn
them into a fix that names both (``access_fix``).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import shlex
import stat
from dataclasses import dataclass
from typing import Any

from doctor.core.result import Remediation

DENIED_ERRNOS = (errno.EACCES, errno.EPERM)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def current_user() -> dict[str, Any]:
    """The user this process runs as (the service's user when the doctor runs as ExecStartPre)."""
    uid, gid = os.geteuid(), os.getegid()
    return {"user": user_name(uid), "uid": uid, "group": group_name(gid), "gid": gid}


def ownership(path: str) -> dict[str, Any] | None:
    """Owner, group and mode of ``path`` (not following a final symlink's target's absence), or None."""
    try:
        st = os.stat(path)
    except OSError:
        try:
            st = os.lstat(path)
        except OSError:
            return None
    return {"path": path, "owner": user_name(st.st_uid), "uid": st.st_uid, "group": group_name(st.st_gid),
            "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "perms": stat.filemode(st.st_mode),
            "is_dir": stat.S_ISDIR(st.st_mode)}


def describe(info: dict[str, Any]) -> str:
    """``owned by alice:staff, mode 0600 (-rw-------)``."""
    return f"owned by {info.get('owner')}:{info.get('group')}, mode {info.get('mode')} ({info.get('perms')})"


def _to_create(item: dict[str, Any]) -> bool:
    """Whether a write record names a directory that does not exist yet (``target`` beside its existing
    ``path``): it is created for the user, never a chown of its parent (e.g. /var)."""
    return bool(item.get("target")) and item.get("target") != item["path"]


def _write_fix(items: list[dict[str, Any]], who: str, what: str) -> Remediation:
    """Give ``who`` its directories: create the missing ones owned by it, take over the existing ones."""
    cmds: list[str] = []
    create = [i["target"] for i in items if _to_create(i)]
    owned = [i["path"] for i in items if not _to_create(i)]
    if create:
        cmds.append(shlex.join(["sudo", "install", "-d", "-o", who, "-m", "0750", *create]))
    if owned:
        cmds.append(shlex.join(["sudo", "chown", f"{who}:", *owned]))
        cmds.append(shlex.join(["sudo", "chmod", "u+rwx", *owned]))
    text = (f"{what.capitalize()} runs as {who} and cannot write here ("
            + "; ".join((f"{i['target']} does not exist and " if _to_create(i) else "")
                        + f"{i['path']} is {describe(i)}" for i in items[:3])
            + "). Give it its directory (or point the cache elsewhere in the service's environment file):")
    return Remediation(text, cmds)


def _read_fix(items: list[dict[str, Any]], who: str, what: str) -> Remediation:
    """Grant read (and search on directories) to all, or make ``who`` the owner: a permission problem, which
    the text says is not damage, so that nobody re-downloads a model that only cannot be read."""
    files = [i for i in items if not i.get("is_dir")]
    dirs = [i for i in items if i.get("is_dir")]
    cmds: list[str] = []
    if dirs:
        cmds.append(shlex.join(["sudo", "chmod", "a+rx", *[d["path"] for d in dirs]]))
    if files:
        cmds.append(shlex.join(["sudo", "chmod", "a+r", *[f["path"] for f in files]]))
    cmds.append(shlex.join(["sudo", "chown", "-R", f"{who}:", *[i["path"] for i in (dirs or files)]])
                + "    # or: make the service's user the owner")
    text = (f"{what.capitalize()} runs as {who} and cannot read "
            + "; ".join(f"{i['path']} ({describe(i)})" for i in items[:3])
            + (f" and {len(items) - 3} more" if len(items) > 3 else "")
            + ". This is a permission problem, not damage: nothing needs downloading. Grant read access:")
    return Remediation(text, cmds)


def access_fix(items: list[dict[str, Any]], need: str, user: dict[str, Any] | None, *,
               what: str = "the service") -> Remediation:
    """The chmod (and the chown alternative) that gives ``user`` ``need`` access ("read" or "write") to
    ``items`` (``ownership`` records). Commands are shell-quoted; nothing is downloaded or deleted."""
    who = (user or {}).get("user") or "the service's user"
    if need == "write":
        return _write_fix(items, who, what)
    return _read_fix(items, who, what)


# -- what another user may reach, from mode bits, owner and groups (never os.access: root would pass) -------


@dataclass(frozen=True)
class Account:
    """A user as the kernel sees it for permission checks: uid and every group it is in."""

    name: str
    uid: int | None  # None: no such user yet (it is judged as a user who owns nothing and is in no group)
    gids: frozenset[int] = frozenset()

    @property
    def exists(self) -> bool:
        return self.uid is not None


def account(name: str) -> Account:
    """The user ``name`` (its primary and supplementary groups), or one that does not exist yet."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return Account(name, None)
    try:
        gids = frozenset(os.getgrouplist(name, pw.pw_gid))
    except OSError:
        gids = frozenset({pw.pw_gid})
    return Account(name, pw.pw_uid, gids)


def permits(st: os.stat_result, who: Account, need: str) -> bool:
    """Whether ``who`` has every permission in ``need`` ("r", "w", "x") on a file with this stat: the owner's
    bits if it owns it, else the group's if it is in the group, else the others' (POSIX ACLs are not read)."""
    mode = stat.S_IMODE(st.st_mode)
    if who.uid == 0:  # root: everything, but executing a file needs some x bit
        return "x" not in need or stat.S_ISDIR(st.st_mode) or bool(mode & 0o111)
    if who.uid is not None and st.st_uid == who.uid:
        shift = 6
    elif st.st_gid in who.gids:
        shift = 3
    else:
        shift = 0
    bits = {"r": 4, "w": 2, "x": 1}
    return all(mode & (bits[c] << shift) for c in need)


MAX_LINKS = 40  # the kernel's limit on symlinks followed in one path (ELOOP)


def first_denied(path: str, who: Account, need: str = "r") -> dict[str, Any] | None:
    """Where ``who`` is stopped on the way to ``path``, as the kernel walks it: search (x) on every directory,
    symlinks followed hop by hop (each target walked from its own directory), then ``need`` on what is at the
    end. ``{"path", "need", "access": ownership}`` of the first component denied; None when it gets through, or
    when something on the way does not exist (that is not a permission question)."""
    parts = [p for p in os.path.abspath(path).split(os.sep) if p]
    cur = os.sep
    hops = 0
    while parts:
        try:
            st = os.stat(cur)
        except OSError:
            return None
        if not permits(st, who, "x"):
            return {"path": cur, "need": "x", "access": ownership(cur)}
        name = parts.pop(0)
        nxt = os.path.join(cur, name)
        if os.path.islink(nxt):
            hops += 1
            if hops > MAX_LINKS:
                return None
            try:
                target = os.readlink(nxt)
            except OSError:
                return None
            parts = [p for p in target.split(os.sep) if p] + parts
            cur = os.sep if target.startswith(os.sep) else cur
            continue
        cur = nxt
    try:
        st = os.stat(cur)
    except OSError:
        return None
    if not permits(st, who, need):
        return {"path": cur, "need": need, "access": ownership(cur)}
    return None
