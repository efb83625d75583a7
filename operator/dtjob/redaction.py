"""Secrets out of any text that may reach a log, an event or the status: SAS signatures, account keys and SAS
in connection strings, bearer tokens. A signed URL keeps its other fields (permissions, expiry), which help
whoever reads the message and grant nothing without the signature. Pure."""

from __future__ import annotations

import re

REDACTED = "REDACTED"

_SIGNATURE = re.compile(r"(?i)(\bsig=)[^&\s\"'<>:;,()]+")
_KEYS = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|SharedAccessKey)=[^;\s\"'<>]+")
_BEARER = re.compile(r"(?i)\b(Bearer\s+)[\w.~+/=-]{8,}")


def redact(text: str) -> str:
    """The text with every SAS signature, account key and bearer token blanked."""
    text = _SIGNATURE.sub(rf"\1{REDACTED}", text)
    text = _KEYS.sub(rf"\1={REDACTED}", text)
    return _BEARER.sub(rf"\1{REDACTED}", text)
