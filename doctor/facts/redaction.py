"""Secrets out of facts, snapshots and reports: by the words of a name, and token-shaped values.

Values are redacted wherever they are recorded or printed: a URL's userinfo
(``http://alice:pa55word@proxy:3128`` -> ``http://<redacted>@proxy:3128``, as in HTTPS_PROXY), query
parameters that carry credentials (``?token=``, ``sig=``, ``X-Amz-Signature=``...), token-shaped strings
(``hf_...``, ``sk-...``), a command line's ``--api-key VALUE``, and values under secret-looking names.
"""

from __future__ import annotations

import re
from typing import Any

# Name-based redaction works on the words of a name, so that HF_TOKEN, DB_PASSWORD and MY_API_KEY are
# secrets while mask_token_id, tokenizer_class, bos_token and num_key_value_heads (model configs) are not.
SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                "AUTH", "COOKIE"}
NOT_SECRET_LAST = {"ID", "IDS", "CLASS", "TYPE", "HEADS", "COUNT", "SIZE", "LEN", "LENGTH", "DIM", "LIMIT", "MAX",
                   "MIN", "FILE", "PATH", "DIR", "URL", "ENDPOINT", "PARALLELISM", "NAME", "KIND"}
LOWER_SECRET_NAMES = {"token", "hf_token", "access_token", "auth_token", "api_key", "apikey", "password", "passwd",
                      "secret", "client_secret", "private_key", "secret_key", "access_key", "cookie"}
SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16})\b")
REDACTED = "<redacted>"
# scheme://user[:password]@host: everything before the last '@' of the authority is userinfo.
URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s'\"]+)@")
SECRET_PARAMS = ("token", "access_token", "auth_token", "id_token", "refresh_token", "api_key", "apikey", "key",
                 "password", "passwd", "pwd", "secret", "client_secret", "sig", "signature", "x-amz-signature",
                 "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential", "sas",
                 "code", "auth", "authorization")
QUERY_SECRET = re.compile(r"(?P<head>[?&;](?P<name>" + "|".join(re.escape(p) for p in SECRET_PARAMS)
                          + r")=)(?P<value>[^&#\s'\"]+)", re.IGNORECASE)
SECRET_FLAG = re.compile(r"(?P<flag>--(?:admin-)?api-key(?:=|\s+))(?P<value>(?!<redacted>)[^\s'\"]+)")


def redact_text(text: str) -> str:
    """Secrets inside free text: URL userinfo, credential query parameters, token-shaped values, --api-key."""
    if not text:
        return text
    text = URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = QUERY_SECRET.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    text = SECRET_FLAG.sub(lambda m: f"{m.group('flag')}{REDACTED}", text)
    return SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of secret flags (``--api-key X``, ``--api-key=X``) and URL secrets hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--api-key", "--admin-api-key"):
            if "=" in arg:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def is_secret_name(name: str) -> bool:
    """Environment-style names (upper case) by their words; config-style (lower case) only when well known."""
    words = [w for w in re.split(r"[_\-.]+", name.upper()) if w]
    if not words:
        return False
    if name.upper() == name:  # an environment variable
        if words[-1] in NOT_SECRET_LAST:
            return False
        return any(w in SECRET_WORDS for w in words) or (words[-1] == "KEY" and len(words) > 1)
    low = name.lower()
    return low in LOWER_SECRET_NAMES or low.endswith(("_password", "_secret", "_api_key", "_access_key"))


def redact(value: Any, key: str = "") -> Any:
    """Redact secrets anywhere in a JSON value: values under secret-looking keys, token-like strings."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    and not isinstance(v, (dict, list, bool)) else redact(v, k))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
