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

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

#: The largest value of a signed 32-bit SQL INTEGER column.
INT32_MAX = 2**31 - 1


#: Code points no printable text holds, as (first, last) ranges: the controls (Cc),
#: the format characters of Unicode 15.1 (Cf: soft hyphen, zero widths, bidi
#: overrides, tags...), private use (Co) and the 66 noncharacters; lone surrogates
#: (Cs) are refused first (they are no Unicode text, so no `pattern` names them). A fixed list rather than `unicodedata`, so that every reader of
#: the log agrees whatever its Python's Unicode version, and so that the published
#: JSON Schema says exactly what is refused (its `pattern`). A code point that is
#: unassigned today is taken: a later Unicode may give it a letter.
UNPRINTABLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xE000, 0xF8FF),
    (0xFDD0, 0xFDEF),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0xFFFE, 0xFFFF),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
    *((plane + 0xFFFE, plane + 0xFFFF) for plane in range(0x10000, 0xF0000, 0x10000)),
    (0xF0000, 0x10FFFF),
)
#: Blanks beyond the controls (what `str.isspace` finds): spaces and separators.
BLANK_RANGES: tuple[tuple[int, int], ...] = (
    (0x0020, 0x0020),
    (0x00A0, 0x00A0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)


def char_class(ranges: tuple[tuple[int, int], ...]) -> str:
    """The body of a regex character class of `ranges` that Python's `re` and
    ECMA-262 (JSON Schema's `pattern`, with the `u` flag) read alike: `\\uXXXX` in the
    Basic Multilingual Plane, the characters themselves above it."""

    def one(cp: int) -> str:
        return f"\\u{cp:04X}" if cp <= 0xFFFF else chr(cp)

    return "".join(one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in ranges)


_UNPRINTABLE = char_class(UNPRINTABLE_RANGES)
#: JSON Schema `pattern`s of the strings below: each is exactly what its validator takes.
PRINTABLE_PATTERN = f"^[^{_UNPRINTABLE}]*$"
WORD_PATTERN = f"^[^{_UNPRINTABLE}{char_class(BLANK_RANGES)}]*$"
EXEC_PATTERN = "^[^\\u0000]*$"
ENV_NAME_PATTERN = f"^[^{_UNPRINTABLE}=]*$"
VISIBLE_ASCII_PATTERN = "^[!-~]*$"
_REFUSED_IN_TEXT = re.compile(f"[{_UNPRINTABLE}]")
_BLANK = re.compile(f"[{char_class(BLANK_RANGES)}]")


#: A lone surrogate (what a str may hold and UTF-8 cannot): one regex search, not a
#: Python loop per character (every string of every spec a snapshot decodes goes here).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(value: str) -> None:
    if _SURROGATE.search(value) is not None:
        raise ValueError("must be valid Unicode (it holds a lone surrogate)")


def printable(value: str) -> str:
    """Reject lone surrogates, and control, format, private-use and noncharacters (NUL,
    newlines, escapes, bidi overrides): everything in `UNPRINTABLE_RANGES`."""
    _no_surrogates(value)
    found = _REFUSED_IN_TEXT.search(value)
    if found is not None:
        raise ValueError(f"must not contain the control character U+{ord(found.group()):04X}")
    return value


def no_blank(value: str) -> str:
    """Printable, and no whitespace either (user names, GPU models, label keys)."""
    printable(value)
    if _BLANK.search(value) is not None:
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


_VISIBLE_ASCII = re.compile("[!-~]*")


def visible_ascii(value: str) -> str:
    """ASCII 0x21-0x7E only: the value travels in a NATS header (`Nats-Msg-Id`)."""
    if _VISIBLE_ASCII.fullmatch(value) is None:
        raise ValueError("must be visible ASCII characters (no spaces or control characters)")
    return value


def env_name(value: str) -> str:
    exec_safe(value)
    printable(value)
    if "=" in value:
        raise ValueError("must not contain '='")
    return value


#: Variables that choose a job's GPUs: the scheduler sets them to what it assigned.
GPU_SELECTION_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
#: The dynamic loader's variables a job may set: only its library search path.
LOADER_ENV_ALLOWED = ("LD_LIBRARY_PATH",)


def reserved_env_reason(name: str) -> str | None:
    """Why a job's `env` may not set `name` (a phrase to follow the name), or None.

    Reserved: the GPU selection, everything `GPULOOM_*` (the job's identity and
    placement), `CUDA_MPS_*` (the limits of a GPU fraction), and every `LD_*`
    but `LD_LIBRARY_PATH` (`LD_PRELOAD`, `LD_AUDIT`... load code into processes
    the scheduler starts). Not a rule of the event contract, which must still
    decode old logs: the gateway refuses such a submission (422), admission
    rejects one that reaches the log another way, and the agent never lets one
    override what it sets.
    """
    if name in GPU_SELECTION_ENV:
        return "selects the GPUs, which the scheduler sets to those it assigned"
    if name.startswith("GPULOOM_"):
        return "is reserved for the scheduler (GPULOOM_*)"
    if name.startswith("CUDA_MPS_"):
        return "is reserved for the scheduler's GPU sharing limits (CUDA_MPS_*)"
    if name.startswith("LD_") and name not in LOADER_ENV_ALLOWED:
        return "steers the dynamic loader (only LD_LIBRARY_PATH of LD_* may be set)"
    return None


#: The names `reserved_env_reason` refuses but LOADER_ENV_ALLOWED, as a JSON Schema
#: `pattern` (the gateway's request schema says `not` this, or one of those).
RESERVED_ENV_PATTERN = "^(" + "|".join(GPU_SELECTION_ENV) + ")$|^GPULOOM_|^CUDA_MPS_|^LD_"


_PRINTABLE = AfterValidator(printable)
_NO_BLANK = AfterValidator(no_blank)


def _pattern(regex: str) -> Any:
    """The `pattern` of the published JSON Schema: documented, not checked twice (the
    validator checks it, with a message naming the character)."""
    return Field(json_schema_extra={"pattern": regex})


#: A job's name: printable, as long as its column.
JobName = Annotated[
    str, Field(min_length=1, max_length=200), _pattern(PRINTABLE_PATTERN), _PRINTABLE
]
#: A user name: no blanks (it is compared, grouped and shown in reports).
UserName = Annotated[str, Field(min_length=1, max_length=100), _pattern(WORD_PATTERN), _NO_BLANK]
#: A GPU model (`A100-80GB`), as long as the usage-by-model column.
ModelName = Annotated[str, Field(min_length=1, max_length=100), _pattern(WORD_PATTERN), _NO_BLANK]
#: A node label or selector key and value (Kubernetes allows 253 for keys).
LabelKey = Annotated[str, Field(min_length=1, max_length=253), _pattern(WORD_PATTERN), _NO_BLANK]
LabelValue = Annotated[str, Field(max_length=253), _pattern(PRINTABLE_PATTERN), _PRINTABLE]
#: A topology level (`nvlink`, `rack`, `block`) or a domain of one (`r12`): shown in
#: pending reasons and grouped by, so a short word.
TopologyName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
#: Free text an operator writes (a cordon reason, a description).
Remark = Annotated[str, Field(max_length=500), _pattern(PRINTABLE_PATTERN), _PRINTABLE]
#: One word of a command line or an environment value (at most EXEC_WORD_BYTES in UTF-8).
ExecWord = Annotated[str, _pattern(EXEC_PATTERN), AfterValidator(exec_safe)]
EnvName = Annotated[
    str, Field(min_length=1, max_length=256), _pattern(ENV_NAME_PATTERN), AfterValidator(env_name)
]
#: An idempotency key: it becomes part of a `Nats-Msg-Id` header.
HeaderValue = Annotated[
    str,
    Field(min_length=1, max_length=200),
    _pattern(VISIBLE_ASCII_PATTERN),
    AfterValidator(visible_ascii),
]


#: Where other nodes reach a node (a gang's rendezvous): a host name or an IPv4 or IPv6
#: address, nothing a shell or a URL could read otherwise.
HOST_ADDRESS = r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$"

#: An OCI image reference as podman and docker take it: `[registry[:port]/]path[:tag][@digest]`
#: (`ubuntu:24.04`, `localhost/team/train:v3`, `registry.example.com:5000/pytorch@sha256:…`).
#: Lowercase path components and no leading `-`, so it can never read as an option.
IMAGE_REFERENCE = (
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?$"
)
_IMAGE_REFERENCE = re.compile(IMAGE_REFERENCE)


def image_reference(value: str) -> str:
    if not _IMAGE_REFERENCE.match(value):
        raise ValueError(
            "not an image reference such as `ubuntu:24.04` or `registry:5000/team/train:v3` "
            "(lowercase path, optional :tag and @sha256:digest)"
        )
    return value


ImageRef = Annotated[
    str,
    Field(min_length=1, max_length=512),
    _pattern(IMAGE_REFERENCE),
    AfterValidator(image_reference),
]
