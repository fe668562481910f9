"""`diagnose` against real failure logs from public issue threads (tests/fixtures/diagnose/).

Each fixture starts with a header (`# source: <issue or PR URL>`, `# title: ...`, `# expect: <check>`)
and then a verbatim excerpt of the log as posted in that thread. The top finding must name the
expected check, with the real matcher and the shipped signatures (doctor/data/failure_signatures.toml).

Splits (by file name):
- dev (no prefix, 40 logs): collected first; the signatures were written while looking at these.
- hold-out, first pass (`holdout-`, 25 logs): collected after the signatures were written and run
  without looking at them first. Measured then: 21/25 (84%): the ptxas "Feature ... not supported on
  .t" near-miss (blamed triton.ptxas), vLLM's "larger than the maximum number of tokens that can be stored
  in KV cache", "Eagle3 is only supported for ... models" and a SafetensorError that was a full disk were
  missed. Those four led to pattern changes, so this split is no longer clean; it stays as regression.
- hold-out, clean (`holdout2-`, 8 logs): collected after those changes, signatures frozen: 8/8.

Decisions the expectations encode (also at the top of the TOML): trust_remote_code prompts are
sglang.flags; a missing auto_map file is model.config; bare "no kernel image" is stack.kernels and
torch's own "not compatible with the current PyTorch installation" is torch.arch; a ptxas that knows the
target but rejects an instruction is stack.kernels; EADDRINUSE on a rendezvous port is gpu.idle; a CUDA
failure in NCCL's NVLS transport (transport/nvls.cc) is gpu.multicast.

One label changed: holdout-nccl-nvls-cuda-failure-vllm-h100.log (vLLM 6732, whose thread posted no resolution)
was labelled gpu.nvlink from its title ("NCCL error: unhandled cuda error"); its lines are NVLS's own
"Cuda failure 1 'invalid argument'", which three real threads of tests/fixtures/diagnose_real/ (NVIDIA/nccl 1672,
1488, 976) resolved as NVLink SHARP multicast (NCCL_NVLS_ENABLE=0, a fabric manager restarted without a GPU reset):
it now expects gpu.multicast. The other NCCL fixtures still name gpu.nvlink through the NCCL error their own
traceback raised (or, for the watchdog one, a first collective that never completed): the log's causal evidence.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from doctor.core.registry import load
from doctor.service.diagnose import (
    GREP_MIN_CHARS,
    SIGNATURE_KEYS,
    SIGNATURES_FILE,
    diagnose_lines,
    load_signatures,
    required_literals,
)

FIXTURES = Path(__file__).parent / "fixtures" / "diagnose"
SOURCE = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+")
KNOWN_CHECKS = {"gpu.driver", "gpu.count", "gpu.arch", "gpu.memory", "gpu.idle", "gpu.health", "gpu.nvlink",
                "gpu.fabric", "cuda.compat", "torch.arch", "stack.versions", "triton.jit", "triton.ptxas",
                "python.venv", "sglang.install", "sglang.patches", "model.shards", "model.config",
                "model.tokenizer", "model.drafter", "model.fit", "host.disk", "host.port", "host.env",
                "sglang.flags", "sglang.ddtree", "cuda.libcuda", "stack.kernels", "host.exposure"}
SIGS = load_signatures()


@dataclass(frozen=True)
class Fixture:
    path: Path
    header: dict[str, str]
    body: list[str]

    @property
    def split(self) -> str:
        name = self.path.name
        return "holdout-clean" if name.startswith("holdout2-") else \
            "holdout-first-pass" if name.startswith("holdout-") else "dev"


def _load(path: Path) -> Fixture:
    header: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines) and (m := re.match(r"# (source|title|expect): (.*)$", lines[i])):
        header[m.group(1)] = m.group(2).strip()
        i += 1
    return Fixture(path, header, lines[i:])


ALL = [_load(p) for p in sorted(FIXTURES.glob("*.log"))]


def top_check(fx: Fixture) -> str | None:
    found = diagnose_lines(fx.body, SIGS)
    return found[0].signature.check if found else None


def test_corpus_size_and_spread() -> None:
    assert len(ALL) >= 45
    assert {f.split for f in ALL} == {"dev", "holdout-first-pass", "holdout-clean"}
    # at least three different checks in each hold-out split: a split of one kind tells nothing
    for split in ("holdout-first-pass", "holdout-clean"):
        assert len({f.header.get("expect") for f in ALL if f.split == split}) >= 3


@pytest.mark.parametrize("fx", ALL, ids=lambda f: f.path.name)
def test_fixture_header(fx: Fixture) -> None:
    assert SOURCE.fullmatch(fx.header.get("source", "")), f"{fx.path.name}: no issue/PR URL in '# source:'"
    assert fx.header.get("title"), fx.path.name
    registered = {c.id for c in load(plugins=False).sorted_checks()}
    assert fx.header.get("expect") in KNOWN_CHECKS | registered, fx.header.get("expect")
    assert 1 <= len(fx.body) <= 80 and any(line.strip() for line in fx.body), fx.path.name


@pytest.mark.parametrize("fx", ALL, ids=lambda f: f.path.name)
def test_top_finding_names_the_expected_check(fx: Fixture) -> None:
    found = diagnose_lines(fx.body, SIGS)
    assert found, f"{fx.path.name}: nothing recognised"
    assert found[0].signature.check == fx.header["expect"], \
        [(f.signature.id, f.signature.check, f.line_no) for f in found]


def test_hit_rate(record_property: pytest.RecordProperty, capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus hit rate, overall and per split (printed; recorded in JUnit properties)."""
    rates = {}
    for split in ("dev", "holdout-first-pass", "holdout-clean", "all"):
        group = [f for f in ALL if split == "all" or f.split == split]
        hits = sum(top_check(f) == f.header["expect"] for f in group)
        rates[split] = (hits, len(group))
        record_property(f"hit_rate_{split}", f"{hits}/{len(group)}")
    with capsys.disabled():
        print("\ndiagnose corpus hit rate: " + ", ".join(f"{k} {h}/{n} ({100 * h / n:.0f}%)"
                                                         for k, (h, n) in rates.items()))
    assert all(h == n for h, n in rates.values()), rates


# -- near-misses: each must not be blamed on the check it resembles --------------------------------

def _fx(name: str) -> Fixture:
    return next(f for f in ALL if f.path.name == name)


@pytest.mark.parametrize("name", ["nearmiss-port-tcpstore-29500.log", "nearmiss-port-distnetworkerror-tcpstore.log",
                                  "holdout-nearmiss-port-vllm-get-open-port-tcpstore.log"])
def test_eaddrinuse_on_a_rendezvous_port_is_not_the_serving_port(name: str) -> None:
    found = diagnose_lines(_fx(name).body, SIGS)
    assert found[0].signature.check == "gpu.idle"
    assert all(f.signature.check != "host.port" for f in found), [f.signature.id for f in found]


def test_serving_port_next_to_serverargs_naming_nccl_port_is_still_the_serving_port() -> None:
    """SGLang prints its ServerArgs (naming nccl_port and dist_init_addr) at every start; that line must
    not make the serving port's EADDRINUSE look internal. Composed of two real lines: the ServerArgs dump
    of sglang#9707 and uvicorn's bind error of vllm#8204."""
    server_args = ("[2025-08-27 19:30:21] server_args=ServerArgs(model_path='openai/gpt-oss-20b', "
                   "tokenizer_path='openai/gpt-oss-20b', tokenizer_mode='auto', skip_tokenizer_init=False, "
                   "load_format='auto', host='0.0.0.0', port=8000, nccl_port=None, dtype='bfloat16')")
    bind = _fx("port-uvicorn-errno98-vllm-ci.log").body
    found = diagnose_lines([server_args, *bind], SIGS)
    assert found[0].signature.check == "host.port"
    assert "ss -ltnp sport = :44319" in found[0].commands  # the port the log named, not the default


@pytest.mark.parametrize("name", ["nearmiss-ptxas-instruction-not-supported-flashinfer.log",
                                  "holdout-nearmiss-ptxas-feature-not-supported-sglang-gptoss.log",
                                  "holdout2-nearmiss-ptxas-feature-requires-target-bf16.log"])
def test_ptxas_rejecting_an_instruction_is_not_triton_ptxas(name: str) -> None:
    found = diagnose_lines(_fx(name).body, SIGS)
    assert found[0].signature.check == "stack.kernels"
    # Triton's own wrapper may still be listed, as a consequence below the cause
    assert all(f.signature.consequence for f in found if f.signature.check == "triton.ptxas")


def test_ptxas_instruction_error_outranks_the_bare_exit_even_when_printed_after_it() -> None:
    """A minimal faithful edit of two real excerpts: Triton's bare CalledProcessError (sglang#14075) and
    ptxas's own reason (flashinfer#1966) printed after it, as Triton logs ptxas's stderr late."""
    bare = _fx("ptxas-bare-255-sm103a-sglang-b300.log").body
    reason = _fx("nearmiss-ptxas-instruction-not-supported-flashinfer.log").body
    found = diagnose_lines([*bare, *reason], SIGS)
    assert found[0].signature.id == "ptxas-instruction-unsupported"


def test_kernel_without_the_arch_under_memory_advice_is_not_model_fit() -> None:
    found = diagnose_lines(_fx("nearmiss-kernels-under-mem-fraction-advice.log").body, SIGS)
    assert found[0].signature.check == "stack.kernels"
    assert all(f.signature.consequence for f in found if f.signature.check == "model.fit")


# -- ranking ------------------------------------------------------------------------------------------

def test_consequences_never_outrank_a_cause_that_comes_later() -> None:
    """Other ranks' NCCL errors (vllm#7896) and SGLang's sigquit often print before the rank that failed
    (here the Python.h failure of sglang#1117): the cause still comes first."""
    echoes = _fx("holdout-nccl-unhandled-cuda-error-vllm-ray.log").body
    sigquit = _fx("nccl-sigquit-before-scheduler-traceback.log").body[:2]
    cause = _fx("tritonjit-python-h-sglang-cuda-graph.log").body
    found = diagnose_lines([*sigquit, *echoes, *cause], SIGS)
    assert found[0].signature.check == "triton.jit"
    assert [f.signature.consequence for f in found] == sorted(f.signature.consequence for f in found)


@pytest.mark.parametrize("first, second", [("fabric-802-pytorch-thc.log", "shards-header-too-large-transformers.log"),
                                           ("shards-header-too-large-transformers.log", "fabric-802-pytorch-thc.log")])
def test_causes_are_ranked_by_first_occurrence(first: str, second: str) -> None:
    a, b = _fx(first), _fx(second)
    found = diagnose_lines([*a.body, *b.body], SIGS)
    assert [f.signature.check for f in found[:2]] == [a.header["expect"], b.header["expect"]]


def test_only_consequences_still_name_the_most_telling_one() -> None:
    found = diagnose_lines(_fx("nccl-sigquit-before-scheduler-traceback.log").body, SIGS)
    assert found[0].signature.id == "nccl-error" and found[0].signature.consequence
    assert found[-1].signature.check is None  # "Received sigquit" points at no check and comes last


# -- the signature data ------------------------------------------------------------------------------

def test_schema_keys_are_documented_at_the_top_of_the_toml() -> None:
    head = re.split(r"^\[\[signature\]\]", SIGNATURES_FILE.read_text(encoding="utf-8"), maxsplit=1, flags=re.M)[0]
    for key in SIGNATURE_KEYS:
        assert re.search(rf"^#.*\b{key}\b", head, re.M), key


def test_every_signature_names_a_fix_and_commands() -> None:
    for sig in SIGS:
        assert sig.fix and sig.commands, sig.id
        assert sig.check is not None or sig.consequence, sig.id


def test_patterns_are_general_not_copied_from_one_log() -> None:
    """Guard against overfitting: no path, model name, host name, pid or timestamp in a pattern."""
    specific = re.compile(r"/usr/|/tmp/|site-packages|\.venv|Qwen|Llama|[Dd]eep[Ss]eek|Kimi-K|gpt-oss|"
                          r"\d{2}:\d{2}:\d{2}|pid=|TP\d")
    for sig in SIGS:
        for pat in (*sig.patterns, *sig.context, *sig.frames, *sig.phase, *sig.process, *sig.absent):
            assert not specific.search(pat.pattern), (sig.id, pat.pattern)


# -- the literal prefilter ------------------------------------------------------------------------------

def test_required_literals_are_in_every_real_line_a_pattern_matches() -> None:
    """The prefilter is sound on real data: each fixture line a pattern matches holds one of the literals
    the matcher derived for that pattern (so restricting the regexes to those lines loses nothing)."""
    lines = [ln for fx in ALL for ln in fx.body]
    checked = 0
    for sig in SIGS:
        for pat in sig.patterns:
            lits = required_literals(pat)
            assert lits is not None, (sig.id, pat.pattern)  # every shipped pattern has one: none scans all
            for line in lines:
                if pat.search(line):
                    hay = line.lower() if pat.flags & re.IGNORECASE else line
                    assert any(lit in hay for lit in lits), (sig.id, pat.pattern, line)
                    checked += 1
    assert checked > len(ALL)


def test_grep_and_python_prefilters_agree_on_a_large_log() -> None:
    """Above GREP_MIN_CHARS the candidate lines come from one `grep -F` pass; below it, or without grep,
    from str.find. Both must give the same findings on a log built from the real excerpts."""
    assert shutil.which("grep"), "grep is part of every supported host and of CI"
    noise = "[2026-11-29 10:00:00 TP3] Decode batch. #running-req: 12, #token: 40231, cuda graph: True"
    lines: list[str] = []
    for fx in ALL:
        lines += [noise] * 300 + fx.body
    assert sum(map(len, lines)) > GREP_MIN_CHARS
    by_grep = diagnose_lines(lines, SIGS)
    by_find = diagnose_lines(lines, SIGS, use_grep=False)
    assert [(f.signature.id, f.line_no, f.count) for f in by_grep] == \
           [(f.signature.id, f.line_no, f.count) for f in by_find]
    assert len(by_grep) >= 25  # most signatures occur somewhere in the corpus


@pytest.mark.parametrize("use_grep", [True, False])
def test_site_patterns_that_ignore_case_or_have_no_literal(tmp_path: Path, use_grep: bool) -> None:
    """A site file may ignore case (searched lower-cased) or have no literal to filter on (searched over
    the whole text); both still find their line in a log above the grep threshold."""
    site = tmp_path / "site.toml"
    site.write_text("[[signature]]\nid = 'nfs'\npatterns = ['(?i)stale file handle']\ncheck = 'host.disk'\n"
                    "fix = 'remount'\ncommands = ['mount -o remount /models']\n\n"
                    "[[signature]]\nid = 'xid'\npatterns = ['Xid \\([^)]*\\): \\d+']\ncheck = 'gpu.health'\n"
                    "fix = 'drain'\ncommands = ['nvidia-smi -q']\n")
    sigs = load_signatures([site])
    noise = "[2026-11-29 10:00:00 TP3] Decode batch. #running-req: 12, #token: 40231, cuda graph: True"
    lines = [noise] * 20000 + ["OSError: [Errno 116] STALE FILE HANDLE: '/models/k26'"] + [noise] * 10 + \
            ["NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."]
    assert sum(map(len, lines)) > GREP_MIN_CHARS
    assert required_literals(next(s for s in sigs if s.id == "xid").patterns[0]) is None
    found = {f.signature.id: f.line_no for f in diagnose_lines(lines, sigs, use_grep=use_grep)}
    assert found == {"nfs": 20001, "xid": 20012, "gpu-fallen-off-bus": 20012}  # the last: a built-in one
