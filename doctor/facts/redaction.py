"""Secrets out of everything the doctor prints or writes: one redaction, by the words of a name and by the
shape of a value.

What is a secret, in one place:

* values under secret-looking names, in data (``{"HF_TOKEN": ...}``) and in text (``DB_PASS=x``,
  ``"api_key": "x"``, ``AccountKey=x;`` in a connection string, ``password: x`` in a log line);
* the value of a secret command-line flag (``--api-key X``, ``--api-key=X``, an abbreviation argparse accepts
  such as ``--api-ke X``, ``--ssl-keyfile-password X``; in an argv list the element after it);
* a URL's userinfo in every spelling (``http://alice:p@ss@proxy:3128`` -> ``http://<redacted>@proxy:3128``;
  ``/cwd/https:/u:p@h`` as a path normalised it, ``//u:p@h``, percent-encoded), credential query
  parameters (``token=``, ``hf_token=``, ``private_token=``, ``sig=``, ``X-Amz-Signature=``...), Slack and
  Discord webhook paths;
* token-shaped strings wherever they stand: ``hf_...``, ``sk-...``, ``ghp_...``, ``github_pat_...``,
  ``glpat-...``, ``xoxb-...``, ``nvapi-...``, ``AKIA...``, ``AIza...``, JSON Web Tokens, ``Bearer``/``Basic``
  credentials, PEM private keys.

``redact`` walks JSON data (names, argv lists, strings); ``redact_text`` does free text. Both are applied where
output leaves the doctor, so no printer or writer can forget them: ``RedactingStream`` wraps stdout and stderr
for the whole CLI (``doctor.cli.main``), ``doctor.commands.options.write_requested`` every file a command is
asked to write (reports, snapshots, units), and the structured writers (snapshot, JSON report, ``env``) redact
their data before serialising it (names are only visible there).
"""

from __future__ import annotations

import re
from typing import IO, Any

from doctor.core.printable import terminal_safe

REDACTED = "<redacted>"

# -- names ------------------------------------------------------------------------------------------------
# Name-based redaction works on the words of a name, so that HF_TOKEN, DB_PASSWORD, MY_API_KEY, SMTP_PASS and
# AccountKey are secrets while mask_token_id, tokenizer_class, bos_token and num_key_value_heads (model configs)
# are not.
SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PWD", "CREDENTIAL", "CREDENTIALS",
                "APIKEY", "AUTH", "COOKIE", "SIGNATURE", "PRIVATEKEY", "ACCESSKEY", "SECRETKEY", "CONNECTIONSTRING",
                "WEBHOOK"}
NOT_SECRET_LAST = {"ID", "IDS", "CLASS", "TYPE", "HEADS", "COUNT", "SIZE", "LEN", "LENGTH", "DIM", "LIMIT", "MAX",
                   "MIN", "FILE", "PATH", "DIR", "URL", "ENDPOINT", "PARALLELISM", "NAME", "KIND", "TTL", "EXPIRY",
                   "ENABLED", "REQUIRED", "MODE", "METHOD", "HEADER"}
NOT_SECRET_ALONE = {"PWD", "OLDPWD", "PASS", "AUTH", "TOKEN"}  # the shell's cwd; a bare word in prose
LOWER_SECRET_NAMES = {"token", "hf_token", "access_token", "auth_token", "refresh_token", "id_token", "api_key",
                      "apikey", "password", "passwd", "pwd", "secret", "client_secret", "private_key", "secret_key",
                      "access_key", "cookie", "private_token", "bearer_token", "session_token", "github_token",
                      "slack_token", "webhook_url", "connection_string", "accountkey", "sharedaccesskey"}
LOWER_SECRET_SUFFIXES = ("_password", "_passwd", "_pass", "_pwd", "_secret", "_api_key", "_apikey", "_access_key",
                         "_secret_key", "_private_key", "_auth_token", "_access_token", "_refresh_token",
                         "_webhook_url")
PROSE_SECRET_WORDS = {"password", "passwd", "passphrase", "apikey", "api_key"}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[_\-.\s]+", _CAMEL.sub("_", name).upper()) if w]


def is_secret_name(name: str) -> bool:
    """Environment-style (upper case) and camelCase names (``AccountKey``) by their words; config-style
    (lower case) names only when well known (``bos_token`` is a tokenizer's, ``hf_token`` a secret)."""
    words = _words(name)
    if not words:
        return False
    if name.lower() == name:  # a config or JSON key
        low = name.lower().replace("-", "_")
        return low in LOWER_SECRET_NAMES or low.endswith(LOWER_SECRET_SUFFIXES)
    if words[-1] in NOT_SECRET_LAST or (len(words) == 1 and words[0] in NOT_SECRET_ALONE):
        return False
    return any(w in SECRET_WORDS for w in words) or (words[-1] == "KEY" and len(words) > 1)


# -- flags ------------------------------------------------------------------------------------------------
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--hf-token", "--token", "--ssl-keyfile-password", "--password",
                "--secret")
MIN_ABBREVIATION = 5  # "--api" and longer: argparse takes an unambiguous prefix of a flag


def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--ssl-keyfile-password``, any flag whose words name a secret (``--hf-token``), and an
    abbreviation of a secret flag that argparse would accept (``--api-ke``)."""
    if not flag.startswith("--") or flag == "--":
        return False
    name = flag[2:]
    if is_secret_name(name.upper().replace("-", "_")):
        return True
    return len(flag) >= MIN_ABBREVIATION and any(s.startswith(flag) for s in SECRET_FLAGS)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of secret flags (``--api-key X``, ``--api-key=X``, ``--api-ke X``) and
    every secret in the other arguments hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name = arg.split("=", 1)[0]
        if is_secret_flag(name):
            if "=" in arg:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


# -- values and text --------------------------------------------------------------------------------------
TOKEN_SHAPES = (
    r"hf_[A-Za-z0-9]{20,}", r"sk-[A-Za-z0-9_-]{20,}", r"gh[pousr]_[A-Za-z0-9]{20,}", r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_-]{20,}", r"xox[abposr]-[A-Za-z0-9-]{10,}", r"nvapi-[A-Za-z0-9_-]{20,}",
    r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA|ASCA)[0-9A-Z]{16}",  # AWS key ids, temporary too
    r"AIza[0-9A-Za-z_-]{35}", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
)
SECRET_VALUE = re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(TOKEN_SHAPES) + r")(?![A-Za-z0-9_])")
PEM_KEY = re.compile(r"-----BEGIN (?P<kind>[A-Z ]*PRIVATE KEY)-----.*?(?:-----END (?P=kind)-----|\Z)", re.S)
BEARER = re.compile(r"(?P<head>\b(?:Bearer\s+|Authorization:\s*\w+\s+))"
                    r"(?P<value>(?!<redacted>)[A-Za-z0-9._~+/=-]{8,})")
WEBHOOK = re.compile(r"(?P<head>\b(?:hooks\.slack\.com/(?:services|workflows|triggers)|discord(?:app)?\.com/api/"
                     r"webhooks)/)(?P<value>[A-Za-z0-9/_-]+)")
# scheme://user[:password]@host: everything before the last '@' of the authority is userinfo ('@' in a password).
# Every spelling: any case, one to three slashes or backslashes (a path normalised it: ``os.path.abspath`` turns
# ``https://u:p@h`` into ``/cwd/https:/u:p@h``), scheme-relative ``//u:p@h``, and percent-encoded
# (``https%3A%2F%2Fu%3Ap%40h``, a URL inside a query parameter).
URL_USERINFO = re.compile(r"(?P<scheme>(?:\b[A-Za-z][A-Za-z0-9+.\-]*:|(?<![:/\\\w])(?=//))[/\\]{1,3})"
                          r"(?P<userinfo>[^/\\?#\s'\"<>]+)@")
URL_USERINFO_ENCODED = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*%3[Aa](?:%2[Ff]|%5[Cc]){1,3})"
                                  r"(?P<userinfo>[^/?#&\s'\"<>]+?)%40")
SECRET_PARAMS = ("token", "key", "pwd", "pass", "secret", "sig", "signature", "sas", "code", "auth",
                 "authorization", "x-amz-credential", "x-amz-security-token", "x-goog-credential", "credential")
QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>(?!<redacted>)[^&#\s'\"\\]+)")
QUOTED_PAIR = re.compile(r"(?P<head>(?P<q>[\"'])(?P<name>[A-Za-z0-9_.\-]+)(?P=q)\s*:\s*)(?P<vq>[\"'])"
                         r"(?P<value>(?:[^\"'\\]|\\.)*)(?P=vq)")
ASSIGNMENT = re.compile(r"(?P<head>(?<![\w.\-/])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>\s*=\s*|:\s+)"
                        r"(?P<q>(?:\\?[\"'])?))(?P<value>(?!<redacted>)(?!\$[({])[^\s\"'&;,\\]+)")
# A flag's name ends in a letter or digit: "--api-" is a word a help text broke at its hyphen ("--api-\n key"),
# and what follows it is the rest of that word, not a value.
FLAG_VALUE = re.compile(r"(?P<head>(?P<flag>--[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?)"
                        r"(?:=(?:\\?[\"'])?|\s+(?:\\?[\"'])?|\\?[\"']\s*,\s*\\?[\"']))"
                        r"(?P<value>(?!<redacted>)(?!--)(?!\$\{[A-Za-z_][A-Za-z0-9_]*\})[^\s'\",\]\\]+)")


def is_secret_param(name: str) -> bool:
    """A query parameter that carries a credential: one of ``SECRET_PARAMS`` or a name whose words say so
    (``hf_token``, ``private_token``, ``X-Amz-Signature``, ``api_key``, ``AccountKey``)."""
    low = name.lower()
    if low in SECRET_PARAMS or is_secret_name(low) or is_secret_name(name.upper().replace("-", "_")):
        return True
    return any(w in ("TOKEN", "SECRET", "PASSWORD", "SIGNATURE", "APIKEY", "CREDENTIAL") for w in _words(name))


def _param(m: re.Match[str]) -> str:
    return m.group("head") + REDACTED if is_secret_param(m.group("name")) else m.group(0)


def _pair(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")) or m.group("value") in ("", REDACTED):
        return m.group(0)
    return f"{m.group('head')}{m.group('vq')}{REDACTED}{m.group('vq')}"


def _assignment(m: re.Match[str]) -> str:
    name = m.group("name")
    if not is_secret_name(name):
        return m.group(0)
    if m.group("sep").strip() == ":" and len(_words(name)) == 1 and name.lower() not in PROSE_SECRET_WORDS:
        return m.group(0)  # "token: <|im_end|>" in a sentence; "password: x" and "DB_PASS: x" are secrets
    value = m.group("value")
    if value.lower() in ("true", "false", "none", "null", "unset", "set", "yes", "no") or not value.strip("."):
        return m.group(0)  # whether there is one (api_key: true), or a placeholder ("..."): not the secret
    return m.group("head") + REDACTED


# A command's help names the value of a flag by its metavar (click's ``--api-key TEXT``): a placeholder, not a
# secret, and hiding it breaks the help's columns.
METAVARS = {"TEXT", "KEY", "VALUE", "STRING", "SECRET", "TOKEN", "FILE", "PATH", "NAME", "<KEY>", "<TOKEN>",
            "<VALUE>", "<SECRET>"}


def _flag(m: re.Match[str]) -> str:
    if not is_secret_flag(m.group("flag")) or m.group(0)[len(m.group("head")):] in METAVARS:
        return m.group(0)
    return m.group("head") + REDACTED


def redact_text(text: str) -> str:
    """Every secret of free text (the module docstring's list), replaced by ``<redacted>``; idempotent."""
    if not text:
        return text
    text = PEM_KEY.sub(lambda m: f"-----BEGIN {m.group('kind')}-----{REDACTED}-----END {m.group('kind')}-----", text)
    text = URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = URL_USERINFO_ENCODED.sub(lambda m: f"{m.group('scheme')}{REDACTED}%40", text)
    text = WEBHOOK.sub(lambda m: m.group("head") + REDACTED, text)
    text = QUERY_PARAM.sub(_param, text)
    text = FLAG_VALUE.sub(_flag, text)
    text = QUOTED_PAIR.sub(_pair, text)
    text = ASSIGNMENT.sub(_assignment, text)
    text = BEARER.sub(lambda m: m.group("head") + REDACTED, text)
    return SECRET_VALUE.sub(REDACTED, text)


def redact(value: Any, key: str = "") -> Any:
    """Redact secrets anywhere in a JSON value: values under secret-looking keys, the element after a secret
    flag in a list of strings (``["--api-key", "X"]``), secrets inside every string."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    and not isinstance(v, (dict, list, bool)) else redact(v, k))
                for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return redact_argv(value)
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_pair(name: str, value: str) -> str:
    """``value`` as it may be shown next to ``name``: hidden when the name is a secret's."""
    return REDACTED if is_secret_name(name) and value else redact_text(value)


class RedactingStream:
    """A text stream whose every write is redacted first: stdout and stderr of the CLI, so no message of any
    command can print a secret. It offers no ``buffer``, so nothing (click included) writes around it. Every
    write is also made terminal-safe (``doctor.core.printable.terminal_safe``): whatever foreign text a printer
    forgot to escape, no control character reaches the terminal but the doctor's own colours."""

    def __init__(self, stream: IO[str]) -> None:
        import os

        self._stream = stream
        try:  # the doctor paints only a colour terminal: elsewhere no escape sequence of its own is ever written
            tty = bool(stream.isatty())
        except (AttributeError, ValueError, OSError):
            tty = False
        self._keep_own = not os.environ.get("NO_COLOR") and (bool(os.environ.get("FORCE_COLOR")) or tty)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._stream.write(terminal_safe(redact_text(text), keep_own=self._keep_own))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in ``RedactingStream`` (once)."""
    import sys

    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)  # type: ignore[assignment]
