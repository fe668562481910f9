"""Fixers of the host area: JIT caches moved to a persistent directory the service's user owns.

Each only plans (``doctor.core.actions``); ``k26-doctor fix --apply`` applies, with a backup of the environment
file, and runs host.jit_cache again.
"""

from __future__ import annotations

import os
from pathlib import Path

from doctor.core.actions import Action, Plan, RunCommand
from doctor.core.context import Context
from doctor.core.registry import fixer
from doctor.core.result import Result
from doctor.host.facts import parse_env_file, writable_ancestor
from doctor.host.jitcache import NOT_WRITABLE, VOLATILE, VOLATILE_FS, persistent_dir
from fixes.triton import env_file_writes, read_env_file, set_env_line


def _env_file_actions(path: Path, old: str, wanted: dict[str, str]) -> list[Action]:
    """The writes that set each wanted variable in the environment file (its folder first when missing); none when
    every line already says so, so a second run plans nothing."""
    text = old
    for var, value in wanted.items():
        if parse_env_file(text).get(var) != value:
            text = set_env_line(text, var, value)
    return env_file_writes(path, text, f"set {', '.join(wanted)} in {path}") if text != old else []


@fixer("host.jit_cache", "Keep the JIT caches on a persistent directory the service's user owns",
       needs=("jit_caches",))
def plan_jit_cache(ctx: Context, result: Result) -> Plan:
    """For each cache on tmpfs or not writable for the service's user: create /var/cache/sglang-k26/<cache> for
    that user and set the cache's variable in the profile's server.env_file (a note names the line when the
    profile has no environment file). Moves nothing: the next start fills the new cache."""
    if not (result.has(VOLATILE) or result.has(NOT_WRITABLE)):
        return Plan()
    fact = ctx.fact("jit_caches")
    user = str(fact.get("user") or "")
    bad = {k: v for k, v in (fact.get("caches") or {}).items()
           if v.get("fstype") in VOLATILE_FS or v.get("writable") is False}
    if not bad or not user:
        return Plan()
    actions: list[Action] = []
    for cache in sorted(bad):
        target = persistent_dir(cache)
        actions.append(RunCommand(f"create {target} for {user}", needs_root=not writable_ancestor(Path(target))[1],
                                  argv=["install", "-d", "-o", user, "-m", "0750", target]))
    wanted = {str(bad[c].get("var")): persistent_dir(c) for c in sorted(bad) if bad[c].get("var")}
    env_file = ctx.settings.server.env_file
    if not env_file:
        return Plan(actions, notes=[f"the profile has no server.env_file: set {v}={d} in the service's environment"
                                    for v, d in wanted.items()])
    path = Path(os.path.expanduser(str(env_file)))
    old = read_env_file(path)
    if old is None:
        return Plan(actions, notes=[f"{path} is not readable: set {v}={d} there by hand" for v, d in wanted.items()])
    return Plan(actions + _env_file_actions(path, old, wanted))
