"""Keeping credentials out of everything a run writes.

Credentials reach the pipeline through the environment (ADC / a key file for
GCS, AWS_* for S3, HF_TOKEN, MLFLOW_TRACKING_USERNAME/PASSWORD), never through
the config: a URL in the config that carries a password is rejected, because
the config is logged as MLflow params and Prefect parameters. `redact` is the
second line of defence for free text such as error messages.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<secret>[^/@\s]+)@")
_TOKENS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face tokens
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"(?i)\b(?:password|passwd|secret|token|api[_-]?key)=[^&\s]+"),
]

URL_FIELDS = ("data.source", "eval.hellaswag_source", "tracking.uri", "runtime.root")
"""Config fields holding URLs, checked for embedded credentials."""


def url_has_credentials(url: str | None) -> bool:
    if not url:
        return False
    return bool(_USERINFO.search(url)) or any(p.search(url) for p in _TOKENS)


def redact(text: str) -> str:
    """Replace URL passwords and recognisable tokens with `***`."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    for pattern in _TOKENS:
        text = pattern.sub("***", text)
    return text
