"""Node lists: a table of cases established with Slurm 22.05's scontrol, properties, the bounds on what
an input may cost. The tables and thousands of generated expressions are compared with `scontrol show
hostnames` in tests/core/test_hostlist_scontrol.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmlaunch.core import hostlist
from slurmlaunch.core.errors import HostlistError, SlurmLaunchError
from tests.helpers import INVALID, VALID, run_cli


@pytest.mark.parametrize(("expr", "hosts"), VALID)
def test_expand_matches_slurm(expr: str, hosts: list[str]) -> None:
    assert hostlist.expand(expr) == hosts
    assert hostlist.count(expr) == len(hosts)
    if hosts:
        assert hostlist.first_host(expr) == hosts[0]
        for i, h in enumerate(hosts):
            assert hostlist.nth_host(expr, i) == h


@pytest.mark.parametrize("expr", INVALID)
def test_invalid_rejected(expr: str) -> None:
    with pytest.raises(HostlistError) as e:
        hostlist.expand(expr)
    assert repr(expr) in str(e.value)  # the message names the faulty expression


def test_huge_list_first_host_and_count_without_expansion() -> None:
    expr = ",".join(f"r{r}n[0-65535]" for r in range(16))  # 1,048,576 hosts
    assert hostlist.count(expr) == 16 * 65536
    assert hostlist.first_host(expr) == "r0n0"
    assert hostlist.nth_host(expr, 16 * 65536 - 1) == "r15n65535"
    assert hostlist.first_host("n[0-65535]" + ",m[0-65535]" * 200) == "n0"


@pytest.mark.parametrize(("expr", "hosts"), [
    ("n[98-102]", ["n98", "n99", "n100", "n101", "n102"]),
    ("n[098-102]x[1]", ["n098x1", "n099x1", "n100x1", "n101x1", "n102x1"]),
    ("a%d[1-2]", ["a%d1", "a%d2"]),
    ("a\x00b[1-2]", ["a\x00b1", "a\x00b2"]),
])
def test_fast_formatting_edges(expr: str, hosts: list[str]) -> None:
    assert hostlist.expand(expr) == hosts == [hostlist.nth_host(expr, i) for i in range(len(hosts))]


def test_range_limit_is_per_range() -> None:
    assert hostlist.count("n[1-65536]") == 65536
    assert hostlist.count("a[0-9]b[0-9999]") == 100000


@pytest.mark.parametrize(("text", "pairs", "values"), [
    ("2(x3),1", [(2, 3), (1, 1)], [2, 2, 2, 1]),
    ("4", [(4, 1)], [4]),
    ("1,2,3", [(1, 1), (2, 1), (3, 1)], [1, 2, 3]),
    ("8(x1024)", [(8, 1024)], [8] * 1024),
])
def test_counts(text: str, pairs: list[tuple[int, int]], values: list[int]) -> None:
    parsed = hostlist.parse_counts(text)
    assert parsed == pairs
    assert [hostlist.count_at(parsed, i) for i in range(len(values))] == values
    assert hostlist.count_at(parsed, len(values)) is None
    assert hostlist.counts_total(parsed) == sum(values)


@pytest.mark.parametrize("text", ["", "2(x)", "2(x0)", "x", "2(3)", "-1", "2(x3", "2,,1", "１"])
def test_counts_invalid(text: str) -> None:
    with pytest.raises(HostlistError):
        hostlist.parse_counts(text)


@settings(max_examples=400)
@given(st.text(alphabet=st.sampled_from(list("ab01-,[] \t+x9")), max_size=24))
def test_any_input_gives_hosts_or_our_error(expr: str) -> None:
    try:
        hosts = hostlist.expand(expr)
    except HostlistError:
        return
    assert hostlist.count(expr) == len(hosts)
    if hosts:
        assert hostlist.first_host(expr) == hosts[0]
        assert hostlist.nth_host(expr, len(hosts) - 1) == hosts[-1]


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 30), st.integers(1, 4)), min_size=1, max_size=4))
def test_generated_ranges_roundtrip(ranges: list[tuple[int, int, int]]) -> None:
    parts, expected = [], []
    for lo, span, width in ranges:
        hi = lo + span
        parts.append(f"{lo:0{width}d}-{hi}")
        expected += [f"n{v:0{width}d}" for v in range(lo, hi + 1)]
    assert hostlist.expand(f"n[{','.join(parts)}]") == expected


def test_errors_are_the_project_family() -> None:
    assert issubclass(HostlistError, SlurmLaunchError)


def test_cli_hostnames() -> None:
    r = run_cli("hostnames", "rack[1-2]-node[01-02]")
    assert r.returncode == 0 and r.stdout.split() == ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]
    r = run_cli("hostnames", "n[5-3]")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "'n[5-3]'" in r.stderr and "Traceback" not in r.stderr


# --- why a list is refused, and what any input may cost ---------------------------------------------

@pytest.mark.parametrize(("expr", "reason"), [
    ("da[1-10]c[1-2,8]p0", "text after ']' in 'da[1-10]c[1-2,8]p0'"),  # not "'[' without ']'"
    ("n[1-2]-ib,m", "text after ']' in 'n[1-2]-ib'"),
    ("a[1,2]b[3,4", "'[' without ']' in 'a[1,2]b[3'"),  # no ']' follows, so the term ends at the ','
    ("n[0-65536]", "too many hosts in range '0-65536'"),
    ("a[0-65535,0]b[1]", "names 65537 hosts"),
    ("a[x]b[1]c[2],d", "in range 'x'"),
    ("n[5-3]", "LO greater than HI in range '5-3'"),
    ("n[18446744073709551616]", "the number '18446744073709551616' is above 2**64-1"),
    ("n[18446744073709551614-18446744073709551615]", "a range reaching 2**64-1"),
    ("a[18446744073709551615]b[1]", "a range reaching 2**64-1"),
    ("n18446744073709551616", "ends in a number above 2**64-1"),
    ("n[" + "7" * 5000 + "]", "a number of 5000 digits"),
    ("n[" + "0" * 65 + "]", "a number of 65 digits"),
])
def test_refusal_reasons(expr: str, reason: str) -> None:
    for f in (hostlist.expand, hostlist.count, hostlist.first_host):
        with pytest.raises(HostlistError) as e:
            f(expr)
        assert reason in str(e.value) and "\n" not in str(e.value)
        assert len(str(e.value)) < 600  # a 5000-digit number is shown by its start and its length


def test_counting_has_no_bound_but_listing_has() -> None:
    huge = "a[0-65535]b[0-65535]"  # 2**32 hosts: Slurm's per-bracket bounds allow it
    assert hostlist.count(huge) == 2**32
    assert hostlist.first_host(huge) == "a0b0"
    assert hostlist.nth_host(huge, 2**32 - 1) == "a65535b65535"
    with pytest.raises(HostlistError, match="names 4294967296 hosts, too many to list"):
        hostlist.expand(huge)
    with pytest.raises(HostlistError, match="too many to list"):
        next(hostlist.iter_hosts(huge))


def test_the_listing_bound_is_exact() -> None:
    at_bound = "a[0-15]b[0-65535]"  # MAX_EXPAND_HOSTS, streamed
    assert sum(1 for _ in hostlist.iter_hosts(at_bound)) == hostlist.MAX_EXPAND_HOSTS == 2**20
    with pytest.raises(HostlistError, match="names 1048577 hosts"):
        hostlist.iter_hosts(at_bound + ",c").__next__()
    long_names = "x" * 1200 + "[0-60000]"  # few hosts, but 72 MB of names
    assert hostlist.count(long_names) == 60001 and hostlist.first_host(long_names) == "x" * 1200 + "0"
    with pytest.raises(HostlistError, match="characters in all, too many to list"):
        hostlist.expand(long_names)
    fits = "x" * 1000 + "[0-60000]"
    assert sum(map(len, hostlist.iter_hosts(fits))) == 60001 * 1000 + sum(len(str(i)) for i in range(60001))


def test_expression_length_bound() -> None:
    at_bound = "n1," * (hostlist.MAX_EXPRESSION // 3) + "n1"  # 131072 characters
    assert len(at_bound) == hostlist.MAX_EXPRESSION and hostlist.count(at_bound) == 43691
    with pytest.raises(HostlistError, match="131073 characters long; at most 131072"):
        hostlist.first_host(at_bound + "1")


def _under_ulimit(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Python run with at most 100 MiB of address space (ulimit -v): a refusal must come first."""
    return subprocess.run(["bash", "-c", 'ulimit -v 102400 && exec "$0" "$@"', sys.executable, *code.split(),
                           *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("expr", [
    "a[0-65535]b[0-65535]",  # issue 13: this reached 11 GB
    "a[0-65535]b[0-65535]c[0-65535]",
    "n[" + "1" * 5000 + "]",  # issue 13: Python's 4300-digit limit
    "n[0-18446744073709551614]",
    "x" * 100000 + "[0-65535]",
    ",".join(["r[0-65535]"] * 1000),
])
def test_cli_refuses_in_bounded_memory(expr: str) -> None:
    r = _under_ulimit("-m slurmlaunch hostnames", expr)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("slurmlaunch: ") and "Traceback" not in r.stderr


def test_api_refuses_in_bounded_memory() -> None:
    # Longer than any argument or environment variable can be, so only through the API.
    code = ("import sys; from slurmlaunch.core import hostlist; from slurmlaunch.core.errors import HostlistError\n"
            "for e in ['n[1-2],' * 30000, 'n[' + '1,' * 70000 + '1]']:\n"
            "    try: hostlist.expand(e)\n"
            "    except HostlistError as x: print(x)\n")
    r = _under_ulimit("-c", code)
    assert r.returncode == 0 and r.stdout.count("at most 131072") == 2, r.stdout + r.stderr[-2000:]
