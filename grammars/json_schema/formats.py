"""String formats as regexes of their JSON-encoded content.

Each regex writes only strings the format's RFC accepts (stricter forms where the full
grammar is costly: no IP literals in URIs, only the full IPv6 form); all of them are plain
characters, no JSON escapes, so length bounds count them one by one.
"""

from __future__ import annotations

import re

# RFC 3986 URIs and references, host names as reg-names (IP literals like [::1] are left
# out: stricter, safe). _U: the characters every component allows (unreserved, sub-delims,
# percent-escapes); a path segment adds ":" and "@" (_P), a first relative segment only "@".
_U = r"([a-zA-Z0-9._~!$&'()*+,;=-]|%[0-9a-fA-F]{2})"
_P = rf"({_U}|[:@])"
_AUTHORITY = rf"//(({_U}|:)*@)?{_U}*(:[0-9]*)?(/({_P}|/)*)?"
_QUERY_FRAGMENT = rf"(\?({_P}|[/?])*)?(#({_P}|[/?])*)?"
_ABSOLUTE_PATH = rf"/({_P}({_P}|/)*)?"
_URI = rf"[a-zA-Z][a-zA-Z0-9+.-]*:({_AUTHORITY}|{_ABSOLUTE_PATH}|{_P}({_P}|/)*)?{_QUERY_FRAGMENT}"
_RELATIVE_REF = rf"({_AUTHORITY}|{_ABSOLUTE_PATH}|({_U}|@)+(/({_P}|/)*)?)?{_QUERY_FRAGMENT}"
# RFC 3339 durations (its appendix A): designators in order, none skipped between years and
# days, weeks alone, whole numbers only (ISO 8601's fractions are left out: stricter, safe).
_DURATION_TIME = "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
_DURATION = (
    f"P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)({_DURATION_TIME})?"
    f"|{_DURATION_TIME}|[0-9]+W)"
)
# Real calendar dates (validators check them: 2023-02-29 and 2024-04-31 are not dates):
# days 1-28 in any month, 29-30 outside February, 31 in the long months, February 29 in
# leap years (divisible by 4, centuries only by 400). Year 0000 does not exist.
_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
_MONTH_DAY = "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
_DATE = f"({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "uri": _URI,
    "hostname": r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
    r"[a-zA-Z0-9])?)*",
    # Stricter than the format (the full form only): safe.
    "ipv6": r"([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
    "uri-reference": f"({_URI}|{_RELATIVE_REF})",
    "duration": _DURATION,
    "byte": r"([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",
}
# Formats the spec defines that we have no regex for: refused by name. Other names (custom
# or OpenAPI hints like "password") are annotations, as validators treat unknown formats.
MISSING_FORMATS = {
    "idn-email", "idn-hostname", "iri", "iri-reference", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
}  # fmt: skip

# The lengths a format's strings can have, where (1, None) does not say it: length bounds
# that hold for every such length need no lookahead.
FORMAT_LENGTHS = {
    "date": (10, 10), "uuid": (36, 36), "ipv4": (7, 15), "uri-reference": (0, None),
    "byte": (0, None),
}  # fmt: skip


def is_format(value: str, name: str) -> bool:
    """Whether `value` is a string this module's regex for format `name` writes (True for
    formats it has no regex for: custom names are annotations)."""
    return name not in FORMATS or re.fullmatch(FORMATS[name], value) is not None
