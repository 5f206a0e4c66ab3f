"""The bounds on every count slurmlaunch accepts, and the one parser of a bounded integer written as text.

Standard library only, no I/O: the launcher, the job description and the CLI all use it. Why bounds at all:
``int()`` of a 5000-digit string raises Python's "Exceeds the limit (4300 digits)" ValueError, and a
20-digit count parses fine but then asks for 10^20 nodes, ranks or array elements, which the code would
start to build before anything noticed. Each bound is what a real site could need, and no more (docs:
Limits). Every check looks at the number of digits before converting, so a rejected value costs nothing.
"""

from __future__ import annotations

from .errors import SlurmLaunchError, SpecError

# Slurm keeps job ids in 32 bits (26 for the local id, 6 for a federation's cluster id: slurm.conf MaxJobId).
MAX_JOB_ID = 2**32 - 1
# Slurm has no hard cap on a job's nodes; the largest Slurm systems run some tens of thousands.
MAX_NODES = 100_000
# Tasks (and so CPUs or GPUs) on one node: slurm.conf's MaxTasksPerNode "may not exceed 65533".
MAX_PER_NODE = 65_533
# torch.distributed ranks are 32-bit signed integers.
MAX_WORLD = 2**31 - 1
# sbatch --array: the largest index is MaxArraySize - 1, and MaxArraySize "may not exceed 4000001".
MAX_ARRAY_INDEX = 4_000_000
# Elements of one array or sweep, each a whole distributed job: Slurm's default MaxJobCount is 10000 jobs, and
# every element counts as one. (A sweep's script also lists every point; the local scheduler builds every
# element's ranks, even for a dry run.)
MAX_ARRAY_ELEMENTS = 10_000
# The local scheduler starts every rank of every element on this one machine (one element after another) and
# its dry run lists each rank with its variables (~10 kB each): ranks over all elements.
MAX_LOCAL_RANKS = 16_384
# Requeues and torchrun restarts: Slurm counts a job's restarts in 16 bits.
MAX_RESTARTS = 65_535
# Timeouts in seconds (rendezvous, following a job, probes): a year.
MAX_SECONDS = 365 * 24 * 3600
# --time: Slurm keeps limits in minutes, in 32 bits (0xffffffff is INFINITE).
MAX_TIME_MINUTES = 2**32 - 2
# --mem: bytes, 1 EiB (no node comes near; Slurm's own field is 64-bit megabytes).
MAX_MEM_BYTES = 2**60


def shown(value: str, limit: int = 60) -> str:
    """``repr(value)``, shortened when long: an error stays one readable line even for a 5000-digit value."""
    text = repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
    return _bytes_shown(text) if "\\udc" in text else text


def _bytes_shown(text: str) -> str:
    """A repr whose lone surrogates (PEP 383: an argument's bytes that were not UTF-8) read as the bytes they
    stand for: '\\xff', as the user typed them, not '\\udcff'."""
    for byte in range(0x80, 0x100):
        text = text.replace(f"\\udc{byte:02x}", f"\\x{byte:02x}")
    return text


def shown_value(value: object, limit: int = 60) -> str:
    """``repr(value)`` of any value (a TOML one), shortened like :func:`shown`; repr() of an int past 4300
    digits raises, so such an int is described by its size."""
    try:
        text = repr(value)
    except ValueError:
        return f"(an integer of {value.bit_length()} bits)" if isinstance(value, int) else "(unprintable)"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' (which int() refuses) and '٣' (which it takes)."""
    return text.isascii() and text.isdigit()


def bounded_int(text: str, maximum: int) -> int | None:
    """``text`` as an integer when it is ASCII digits and at most ``maximum``; None otherwise, without ever
    converting more digits than ``maximum`` has."""
    if not is_digits(text) or len(text.lstrip("0")) > len(str(maximum)):
        return None
    value = int(text)
    return value if value <= maximum else None


def parse_count(what: str, text: str, minimum: int = 0, maximum: int = MAX_JOB_ID, sep: str = " ",
                error: type[SlurmLaunchError] = SpecError, hint: str = "") -> int:
    """A non-negative integer in ASCII digits within [minimum, maximum], else ``error`` naming ``what``
    and the value: "--nodes '99999999999999999999' is not valid (expected an integer 1..100000)".
    ``sep`` joins name and value: " " for an option, "=" for a variable."""
    value = bounded_int(text, maximum)
    if value is None or value < minimum:
        import re  # here, not at the top: this module is on the launcher's start path, which must not load `re`

        # an option's number is shown as itself (--nodes -3); a variable's value quoted (SLURM_PROCID='-1')
        plain = sep == " " and re.fullmatch(r"-?[0-9]{1,40}", text) is not None
        raise error(f"{what}{sep}{text if plain else shown(text)} is not valid (expected an integer "
                    f"{minimum}..{maximum}{hint})")
    return value


def check_count(what: str, value: int | None, minimum: int, maximum: int, hint: str = "") -> None:
    """SpecError unless ``value`` (None: not given) lies in [minimum, maximum]."""
    if value is not None and not minimum <= value <= maximum:
        # str() of a huge int raises past 4300 digits: describe it by its size instead.
        text = str(value) if abs(value) < 10**40 else f"(an integer of {value.bit_length()} bits)"
        raise SpecError(f"{what} {text} is not valid (expected an integer {minimum}..{maximum}{hint})")


class Count:
    """argparse type: an integer within [minimum, maximum] in ASCII digits. int() would also take ' 4\\n',
    '1_000', '٤', and 5000 digits with a traceback; a bad value is one SpecError line naming the option."""

    kind = "int"  # what profiles.option_table reads: a TOML integer in a profile

    def __init__(self, what: str, minimum: int, maximum: int) -> None:
        self.what, self.minimum, self.maximum = what, minimum, maximum
        self.__name__ = "integer"

    def __call__(self, text: str) -> int:
        return parse_count(self.what, text, self.minimum, self.maximum)


class Seconds:
    """argparse type: seconds within [0, MAX_SECONDS], digits with an optional fraction (float() would also
    take 'nan', 'inf' and '1e999')."""

    kind = "float"

    def __init__(self, what: str) -> None:
        self.what = what
        self.__name__ = "seconds"

    def __call__(self, text: str) -> float:
        import re  # see parse_count

        if re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", text) and float(text) <= MAX_SECONDS:
            return float(text)
        raise SpecError(f"{self.what} {shown(text)} is not valid (expected seconds 0..{MAX_SECONDS}, "
                        f"e.g. 300 or 2.5)")
