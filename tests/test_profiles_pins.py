"""Every built-in profile is consistent with the Requires-Dist of what it pins, read from the released
wheels' real metadata; compat.toml's SGLang pins are those wheels' pins."""

from __future__ import annotations

import re

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from sglang_wheels import release_requires

from doctor.core.settings import load_profile, profile_names
from doctor.stack import compat

pytestmark = pytest.mark.network  # reads the released wheels (tests/downloads.py)

# profile [stack] key -> the distribution it pins
DISTS = {"torch": "torch", "triton": "triton", "sglang": "sglang", "sglang_kernel": "sglang-kernel",
         "flashinfer": "flashinfer-python"}
LINUX = dict(default_environment(), sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
             python_version="3.12", python_full_version="3.12.3", extra="")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(profile: dict) -> dict[str, str]:
    """``{distribution: version}`` for the profile's exact (==) pins."""
    out = {}
    for key, dist in DISTS.items():
        spec = SpecifierSet(profile["stack"][key])
        exact = [s.version for s in spec if s.operator == "=="]
        assert len(exact) == 1, f"{profile['name']}: stack.{key} {spec} is not one version"
        out[dist] = exact[0]
    return out


@pytest.mark.parametrize("name", profile_names())
def test_profile_pins_satisfy_each_pinned_wheels_requirements(name):
    pins = pinned(load_profile(name))
    broken = []
    for dist, version in pins.items():
        for text in release_requires(dist, version):
            req = Requirement(text)
            if norm(req.name) not in pins or (req.marker is not None and not req.marker.evaluate(LINUX)):
                continue
            if not req.specifier.contains(pins[norm(req.name)], prereleases=True):
                broken.append(f"{dist} {version} requires {req}, the profile pins {pins[norm(req.name)]}")
    assert not broken, f"{name}: " + "; ".join(broken)


def test_compat_table_holds_the_released_pins():
    """The releases the profiles pin, and the last built for torch 2.11 (sglang-kernel 0.4.5's)."""
    releases = {pinned(load_profile(n))["sglang"] for n in profile_names()} | {"0.5.17"}
    for version in sorted(releases):
        reqs = {norm(Requirement(t).name): Requirement(t) for t in release_requires("sglang", version)}
        table = {"torch": compat.sglang_torch(version), **compat.sglang_pins(version)}
        assert str(reqs["torch"].specifier) == f"=={table['torch']}", version
        assert str(reqs["sglang-kernel"].specifier) == f"=={table['sglang_kernel']}", version
        assert str(reqs["flashinfer-python"].specifier) == f"=={table['flashinfer']}", version


def test_sglang_kernel_wheels_name_their_torch():
    """0.4.10 requires the torch SGLang 0.5.23 pins; 0.4.5 (SGLang 0.5.16/0.5.17, torch 2.11.0) names none."""
    assert release_requires("sglang-kernel", "0.4.10") == [f"torch=={compat.sglang_torch('0.5.23')}"]
    assert release_requires("sglang-kernel", "0.4.5") == []
    assert compat.sglang_pins("0.5.17")["sglang_kernel"] == "0.4.5" and compat.sglang_torch("0.5.17") == "2.11.0"


def test_torch_triton_pins_are_the_wheels():
    for torch in ("2.11.0", "2.14.1"):
        triton = next(Requirement(t) for t in release_requires("torch", torch) if norm(Requirement(t).name) == "triton")
        want = compat.triton_for_torch(torch)
        assert str(triton.specifier) == (want if not want[0].isdigit() else f"=={want}")
