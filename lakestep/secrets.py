"""Keeping credentials out of messages, reprs and logs.

Database URLs carry passwords (``postgresql://user:secret@host/db``). Every
message lakestep builds from a URL, and every error text that came from a
driver, goes through :func:`mask_url` first.
"""

from __future__ import annotations

import re

# scheme://user:password@  (also when the scheme is malformed, e.g. "postgres ql://")
_USERINFO = re.compile(r"(?P<head>[A-Za-z][\w+.\- ]*://[^\s:/@'\"]*:)(?P<secret>[^\s'\"/]+)(?P<tail>@)")
# libpq key=value strings and URL query parameters: password=..., passwd=..., sslpassword=...;
# object-store credentials (storage options and the AWS variables): secret_key=..., AWS_SESSION_TOKEN=...
_KEYVALUE = re.compile(r"(?P<head>\b(?:password|passwd|pwd|sslpassword|secret|token|(?:aws_)?(?:secret_key|access_key"
                       r"|session_token|secret_access_key|access_key_id))\s*[=:]\s*)(?P<secret>[^\s&;,'\"]+)",
                       re.IGNORECASE)

MASK = "***"


def mask_url(text: str) -> str:
    """``text`` with the password of every URL (and every ``password=...``) replaced by ``***``."""
    text = _USERINFO.sub(lambda m: m.group("head") + MASK + m.group("tail"), str(text))
    return _KEYVALUE.sub(lambda m: m.group("head") + MASK, text)
