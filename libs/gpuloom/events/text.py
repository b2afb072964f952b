"""Constrained strings and integers of the wire contract: what storage, the bus and
`exec` can all hold.

Every reader validates events against these types, so a value the contract lets
through is one that the SQL projections (column lengths, 32-bit integers,
PostgreSQL's refusal of NUL), NATS (subject tokens, header values) and the node
agents (`execve` takes no NUL, UTF-8 has no lone surrogates) can take. A value
they cannot take is refused at the edge with a 422 naming the field, or, when it
arrives on the bus some other way, the event is malformed and dead-lettered.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Field

#: The largest value of a signed 32-bit SQL INTEGER column.
INT32_MAX = 2**31 - 1


def _no_surrogates(value: str) -> None:
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("must be valid Unicode (it holds a lone surrogate)")


def printable(value: str) -> str:
    """Reject control and format characters (NUL, newlines, escapes, bidi overrides)."""
    _no_surrogates(value)
    for ch in value:
        if unicodedata.category(ch)[0] == "C":
            raise ValueError(f"must not contain the control character U+{ord(ch):04X}")
    return value


def no_blank(value: str) -> str:
    """Printable, and no whitespace either (user names, GPU models, label keys)."""
    printable(value)
    if any(ch.isspace() for ch in value):
        raise ValueError("must not contain whitespace")
    return value


#: The most UTF-8 bytes of one argument or environment value: Linux refuses a string
#: over 128 KiB (MAX_ARG_STRLEN, counting `NAME=` and the final NUL) with E2BIG; the
#: margin covers the longest `NAME=` (256 characters of up to 4 bytes).
EXEC_WORD_BYTES = 128 * 1024 - 1100


def exec_safe(value: str) -> str:
    """What `execve` can pass: no NUL, valid UTF-8, within the kernel's per-string
    limit. Newlines and tabs are fine (a multi-line `sh -c` script is an ordinary
    argument)."""
    _no_surrogates(value)
    if "\0" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    size = len(value.encode())
    if size > EXEC_WORD_BYTES:
        raise ValueError(f"is {size} bytes in UTF-8; a program takes at most {EXEC_WORD_BYTES}")
    return value


def visible_ascii(value: str) -> str:
    """ASCII 0x21-0x7E only: the value travels in a NATS header (`Nats-Msg-Id`)."""
    if not all("!" <= ch <= "~" for ch in value):
        raise ValueError("must be visible ASCII characters (no spaces or control characters)")
    return value


def env_name(value: str) -> str:
    exec_safe(value)
    printable(value)
    if "=" in value:
        raise ValueError("must not contain '='")
    return value


_PRINTABLE = AfterValidator(printable)
_NO_BLANK = AfterValidator(no_blank)

#: A job's name: printable, as long as its column.
JobName = Annotated[str, Field(min_length=1, max_length=200), _PRINTABLE]
#: A user name: no blanks (it is compared, grouped and shown in reports).
UserName = Annotated[str, Field(min_length=1, max_length=100), _NO_BLANK]
#: A GPU model (`A100-80GB`), as long as the usage-by-model column.
ModelName = Annotated[str, Field(min_length=1, max_length=100), _NO_BLANK]
#: A node label or selector key and value (Kubernetes allows 253 for keys).
LabelKey = Annotated[str, Field(min_length=1, max_length=253), _NO_BLANK]
LabelValue = Annotated[str, Field(max_length=253), _PRINTABLE]
#: Free text an operator writes (a cordon reason, a description).
Remark = Annotated[str, Field(max_length=500), _PRINTABLE]
#: One word of a command line or an environment value.
ExecWord = Annotated[str, AfterValidator(exec_safe)]
EnvName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(env_name)]
#: An idempotency key: it becomes part of a `Nats-Msg-Id` header.
HeaderValue = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(visible_ascii)]
