"""Issue 21, secrets: planted secrets of every kind the issue names, then every command that prints or writes,
and every byte of every output and written file searched for them.

Kinds: ``[server] args = ["--api-key", X]`` (two elements), ``[server] api_key``, query parameters beyond the
known names (``hf_token=``, ``private_token=``), a proxy password holding ``@``, a JWT, ``*_PASS``, an Azure
``AccountKey=``, a Slack webhook URL, an ``hf_`` token, secrets inside the model's config.json, an abbreviated
``--api-ke VALUE``, a site-pinned secret the profile also sets, a log with ``--api-key V``, ``HF_TOKEN=hf_...``
and ``token=``, a URL with ``user:pass@``, and ``systemd-unit -- --api-key X``.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import doctor_env, run_doctor
from hostile_support import small_model

from doctor.facts.redaction import REDACTED, is_secret_name, redact, redact_argv, redact_text

pytestmark = pytest.mark.timeout(300)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJrMjYtZG9jdG9yIn0.c2lnbmF0dXJlLXBhcnQtMTIzNDU2"
HF = "hf_" + "Q7w" * 10
SECRETS = {
    "args_api_key": "ArgsApiKey77xq",
    "config_api_key": "CfgApiKey21zz",
    "hf_token_param": "HfParamSecret55",
    "private_token": "PrivTokSecret66",
    "proxy_password": "Pr0xyPw",  # the password is "Pr0xyPw@rd9": '@' inside it
    "proxy_password_tail": "rd9@",
    "jwt": JWT.split(".")[1],
    "smtp_pass": "SmtpPassValue7731",
    "azure_key": "QXp1cmVBY2NvdW50S2V5VmFsdWU",
    "slack": "SlackHookSecret4242",
    "hf_token": HF,
    "model_hf_token": "CfgHfTok88a",
    "model_url_password": "CfgUrlPw99",
    "abbreviated": "AbbrevKey1010",
    "pinned": "PinnedSite1111",
    "pinned_profile": "PinnedProf1112",
    "log_api_key": "LogApiKey1212",
    "log_hf": "hf_" + "L0g" * 10,
    "log_token": "LogTok1313",
    "url_password": "UrlPw1414",
    "unit_key": "UnitKey1515",
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("secrets")
    model = small_model(root / "model")
    cfg = json.loads((model / "config.json").read_text())
    cfg["hf_token"] = SECRETS["model_hf_token"]
    cfg["_name_or_path"] = f"https://bob:{SECRETS['model_url_password']}@hub.example/org/model"
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    config = root / "k26.toml"
    config.write_text(f'[server]\nargs = ["--api-key", "{SECRETS["args_api_key"]}"]\nhost = "0.0.0.0"\n'
                      f'api_key = "{SECRETS["config_api_key"]}"\n'
                      f'[server.env]\nSLACK_TOKEN = "{SECRETS["pinned_profile"]}"\n')
    log = root / "server.log"
    log.write_text(f"launching: python -m sglang.launch_server --api-key {SECRETS['log_api_key']} --port 30000\n"
                   f"env HF_TOKEN={SECRETS['log_hf']}\nGET https://hub.example/x?token={SECRETS['log_token']}\n"
                   "Failed to initialize NVML\n")
    return {"root": root, "model": model, "config": config, "log": log}


def planted_env() -> dict[str, str]:
    return doctor_env(
        HTTPS_PROXY="http://alice:Pr0xyPw@rd9@proxy.example:3128",
        HF_ENDPOINT=f"https://mirror.example/m?hf_token={SECRETS['hf_token_param']}&rev=main",
        GITLAB_API=f"https://gitlab.example/api/v4?private_token={SECRETS['private_token']}",
        MY_JWT=JWT,
        SMTP_PASS=SECRETS["smtp_pass"],
        AZURE_STORAGE_CONNECTION_STRING=("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
                                         f"{SECRETS['azure_key']}==;EndpointSuffix=core.windows.net"),
        SLACK_WEBHOOK_URL=f"https://hooks.slack.com/services/T0K26/B0K26/{SECRETS['slack']}",
        HF_TOKEN=HF,
        SLACK_TOKEN=SECRETS["pinned"],
    )


def leaks(outputs: dict[str, str]) -> list[str]:
    return [f"{kind} in {where}" for where, text in outputs.items() for kind, value in SECRETS.items()
            if value in text]


def run(label: str, outputs: dict[str, str], *args: str, expect: tuple[int, ...] = (0, 1)) -> None:
    out = run_doctor(*args, env=planted_env(), timeout=200)
    assert out.returncode in expect, (label, out.returncode, out.stderr[-800:])
    outputs[f"{label} stdout"] = out.stdout
    outputs[f"{label} stderr"] = out.stderr


def test_no_planted_secret_in_any_output_or_written_file(planted: dict[str, Path]) -> None:
    root, model, config, log = planted["root"], planted["model"], planted["config"], planted["log"]
    sel = ["--config", str(config), "--model-path", str(model), "--python", "/bin/true"]
    outputs: dict[str, str] = {}
    files = {name: root / name for name in ("snap.json", "report.txt", "report.json", "report.xml", "unit.service")}
    run("snapshot", outputs, "snapshot", *sel, "--fact", "env", "--fact", "model", "--fact", "model.tokenizer")
    run("snapshot --output", outputs, "snapshot", *sel, "--fact", "env", "--fact", "model", "--output",
        str(files["snap.json"]))
    checks = ["--only", "host.*", "--only", "model.config", "--only", "sglang.flags", "-v"]
    for fmt, name in (("text", "report.txt"), ("json", "report.json"), ("junit", "report.xml")):
        run(f"check -v {fmt}", outputs, "check", *sel, *checks, "--format", fmt)
        run(f"check -v {fmt} --output", outputs, "check", *sel, *checks, "--format", fmt, "--output", str(files[name]))
    run("replay", outputs, "check", "--from-snapshot", str(files["snap.json"]), "-v", "--only", "host.*",
        "--only", "model.config")
    for fmt in ("text", "json"):
        run(f"env {fmt}", outputs, "env", *sel, "--format", fmt)
        run(f"env --from-snapshot {fmt}", outputs, "env", "--from-snapshot", str(files["snap.json"]), "--format", fmt)
    run("fix", outputs, "fix", *sel, "--only", "host.*")
    run("launch --dry-run", outputs, "launch", "--dry-run", "--no-flag-check", *sel, "--",
        "--api-ke", SECRETS["abbreviated"])
    for fmt in ("text", "json"):
        run(f"diagnose {fmt}", outputs, "diagnose", str(log), "--format", fmt)
    url = f"http://k26:{SECRETS['url_password']}@127.0.0.1:9"
    run("smoke", outputs, "smoke", "--url", url, "--timeout", "1")
    run("smoke json", outputs, "smoke", "--url", url, "--timeout", "1", "--format", "json")
    run("wait-ready", outputs, "wait-ready", "--url", url + "/health", "--timeout", "1", "--interval", "0.2")
    secrets_file = root / "unit.secrets"
    run("systemd-unit refused", outputs, "systemd-unit", *sel[:2], "--doctor", "/usr/bin/true", "--",
        "--api-key", SECRETS["unit_key"], expect=(2,))
    run("systemd-unit", outputs, "systemd-unit", *sel[:2], "--doctor", "/usr/bin/true", "--secrets-file",
        str(secrets_file), "--output", str(files["unit.service"]), "--", "--api-key", SECRETS["unit_key"])
    for name, path in files.items():
        outputs[name] = path.read_text()
    assert leaks(outputs) == []
    # the secrets reach where they must: the unit's 0600 secrets file, the JSON report with the key redacted
    assert SECRETS["unit_key"] in secrets_file.read_text()
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert f"EnvironmentFile={secrets_file}" in outputs["unit.service"]
    assert "--api-key ${K26_SERVER_API_KEY}" in outputs["unit.service"]
    assert REDACTED in outputs["snap.json"] and json.loads(outputs["snap.json"])["kind"] == "k26-doctor-snapshot"
    json.loads(outputs["report.json"])  # redaction leaves the JSON valid
    assert f"SLACK_TOKEN={REDACTED} pinned by the site is kept (profile wants {REDACTED})" in outputs[
        "launch --dry-run stderr"]


def test_the_unit_with_a_secret_is_one_systemd_accepts(planted: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (.ci/run installs systemd)")
    unit = tmp_path / "sglang-k26-ddtree.service"
    out = run_doctor("systemd-unit", "--doctor", "/usr/bin/true", "--secrets-file", str(tmp_path / "s.env"),
                     "--output", str(unit), "--", "--api-key", SECRETS["unit_key"], env=planted_env())
    assert out.returncode == 0, out.stderr
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert [ln for ln in res.stderr.splitlines() if unit.name in ln and "EnvironmentFile" not in ln] == [], res.stderr


@pytest.mark.parametrize("text, secret", [
    ("http://alice:p@ss@proxy:3128", "p@ss"),
    ("https://hub/x?hf_token=abc123&rev=main", "abc123"),
    ("https://gitlab/api?private_token=zzz999", "zzz999"),
    (f"MY_JWT={JWT}", JWT.split(".")[2]),
    ("SMTP_PASS=hunter2", "hunter2"),
    ("DB_PWD=hunter3", "hunter3"),
    ("AccountName=a;AccountKey=c2VjcmV0a2V5;EndpointSuffix=core.windows.net", "c2VjcmV0a2V5"),
    ("SharedAccessSignature=sv=2020&sig=Zm9vYmFy", "Zm9vYmFy"),
    ("https://hooks.slack.com/services/T1/B2/hooksecret", "hooksecret"),
    ("https://discord.com/api/webhooks/123/discordsecret", "discordsecret"),
    ("--api-ke abbreviated1", "abbreviated1"),
    ("--api=abbreviated2", "abbreviated2"),
    ("--ssl-keyfile-password kfpass", "kfpass"),
    ("args = ['--api-key', 'listed']", "listed"),
    ('{"api_key": "jsonkey"}', "jsonkey"),
    ("password: hunter4", "hunter4"),
    ("Authorization: Bearer abcdefgh12345678", "abcdefgh12345678"),
    ("nvapi-" + "n" * 30, "n" * 30),
    ("xoxb-1234567890-abcdefghij", "abcdefghij"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----", "MIIEv"),
])
def test_every_kind_is_redacted_in_text(text: str, secret: str) -> None:
    assert secret not in redact_text(text)
    assert redact_text(redact_text(text)) == redact_text(text)


@pytest.mark.parametrize("text", ["http://proxy:3128", "git@github.com:org/repo.git", "mail alice@example.com",
                                  "https://hub/x?revision=main&keyword=a", "--tp-size 8", "PWD=/home/user",
                                  "special token: <|im_end|>", "TOKENIZERS_PARALLELISM=false", "api_key: true",
                                  "--api-key ${K26_SERVER_API_KEY}", 'api_key = "$(openssl rand -hex 32)"',
                                  '[server] api_key = "..." in the config',
                                  "secret values (--api-key, URL credentials) are shown as <redacted>",
                                  "HTTP Basic authentication", '"mask_token_id": 163838, "bos_token": "<s>"'])
def test_what_is_not_a_secret_is_left(text: str) -> None:
    assert redact_text(text) == text


def test_argv_lists_and_names() -> None:
    assert redact({"server": {"args": ["--api-key", "X", "--port", "1"]}}) == {
        "server": {"args": ["--api-key", REDACTED, "--port", "1"]}}
    assert redact_argv(["--api-ke", "X", "--admin-api-key=a"]) == ["--api-ke", REDACTED, f"--admin-api-key={REDACTED}"]
    for name in ("AccountKey", "SharedAccessSignature", "SMTP_PASS", "apiKey", "accessToken", "private_token"):
        assert is_secret_name(name), name
    for name in ("PWD", "bos_token", "KEYBOARD", "HF_TOKEN_PATH", "mask_token_id"):
        assert not is_secret_name(name), name


def test_a_redacted_stream_offers_no_way_around_it() -> None:
    import io

    from doctor.facts.redaction import RedactingStream

    buf = io.StringIO()
    stream = RedactingStream(buf)
    stream.write(f"--api-key {SECRETS['unit_key']}\n")
    assert SECRETS["unit_key"] not in buf.getvalue() and not hasattr(stream, "buffer")
    with pytest.raises(TypeError):
        stream.write(b"bytes")  # type: ignore[arg-type]

