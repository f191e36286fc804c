"""Keeping credentials out of everything a run writes.

Credentials reach the pipeline through the environment (ADC / a key file for
GCS, AWS_* for S3, HF_TOKEN, MLFLOW_TRACKING_USERNAME/PASSWORD), never through
the config: a URL in the config that carries one is rejected, because the
config is logged as MLflow params and Prefect parameters. `redact` is the
second line of defence for free text such as error messages and log lines.

Each pattern's `keep` group (the scheme, a user name, a parameter name) stays,
the rest of the match becomes `***`, so a redacted URL still says what it was.
"""

from __future__ import annotations

import re

# Names whose value is a secret wherever `name=` appears (a query string, a
# form body, an error message): distinctive enough not to occur otherwise.
_SECRET_NAMES = (
    "password|passwd|secret|client_secret|token|access_token|api[_-]?key"
    "|x-amz-signature|x-amz-credential|x-amz-security-token"  # AWS presigned URLs
    "|x-goog-signature|x-goog-credential"  # GCS signed URLs
)
# Short names that are secrets only as query parameters (Azure SAS `sig`,
# Google API `key`); elsewhere `key=` is ordinary (hive paths: .../key=2024/).
_QUERY_ONLY_NAMES = "sig|key"
_VALUE = r"[^&#\s'\"]+"

_PATTERNS = [
    # Any userinfo in a URL with a scheme: `user:password@`, or a bare token
    # as the user (`https://TOKEN@host`), keeping only the user of the first
    # form. Greedy up to the authority's last `@`, so a password holding an
    # unencoded `@` is masked whole. `git@host:repo` and e-mail addresses
    # have no scheme and are left alone, and so is Azure's
    # `abfs://container@account.dfs.core.windows.net/`: a location.
    re.compile(r"(?P<keep>\b(?!(?:abfss?|az|wasbs?)://[^/?#\s:@]+@)[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^/?#\s:@]*:)?)"
               r"[^/?#\s]+(?=@)"),
    re.compile(rf"(?i)(?P<keep>\b(?:{_SECRET_NAMES})=){_VALUE}"),
    re.compile(rf"(?i)(?P<keep>[?&](?:{_QUERY_ONLY_NAMES})=){_VALUE}"),
    re.compile(r"(?i)(?P<keep>\bauthorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token)\s+)?)[^\s'\",]+"),
    re.compile(r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face tokens
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL),
]

URL_FIELDS = ("data.source", "eval.hellaswag_source", "tracking.uri", "runtime.root", "train.init_from")
"""Config fields holding URLs, checked for embedded credentials."""


def url_has_credentials(url: str | None) -> bool:
    if not url:
        return False
    return any(p.search(url) for p in _PATTERNS)


def _mask(match: re.Match) -> str:
    keep = match.groupdict().get("keep") or ""
    return keep + "***"


def redact(text: str) -> str:
    """Replace URL userinfo, secret parameters' values and recognisable tokens
    with `***`, keeping what names them (`https://user:***@`, `sig=***`)."""
    for pattern in _PATTERNS:
        text = pattern.sub(_mask, text)
    return text
