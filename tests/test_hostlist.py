"""Node lists: a table of cases established with Slurm 22.05's scontrol, properties, and a live
comparison with `scontrol show hostnames` where it is installed."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmlaunch import hostlist
from slurmlaunch.errors import HostlistError, SlurmLaunchError
from tests.conftest import run_cli

# (expression, hosts as scontrol show hostnames prints them)
VALID = [
    ("", []),
    ("node1", ["node1"]),
    ("node1-5", ["node1-5"]),
    ("a,a,b", ["a", "a", "b"]),
    ("a b\tc", ["a", "b", "c"]),
    (",a", ["a"]),
    ("n[1-2],,m", ["n1", "n2", "m"]),
    ("n[1-3],", ["n1", "n2", "n3"]),
    ("node[01-10]", [f"node{i:02d}" for i in range(1, 11)]),
    ("node[009-11]", ["node009", "node010", "node011"]),
    ("node[1-010]", [f"node{i}" for i in range(1, 11)]),
    ("n[9-010]", ["n9", "n10"]),
    ("n[01-9]", [f"n{i:02d}" for i in range(1, 10)]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[00-00]", ["n00"]),
    ("n[007]", ["n007"]),
    ("n[1,01]", ["n1", "n01"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("n[9-11],n[1]", ["n9", "n10", "n11", "n1"]),
    ("n[1-]", ["n1"]),
    ("n[3-3]", ["n3"]),
    ("n[ 1-2]", ["n01", "n02"]),
    ("n[1 -2]", ["n01", "n02"]),
    ("n[+1-2]", ["n01", "n02"]),
    ("n[1y-2]", ["n01", "n02"]),
    ("n[1- 2]", ["n1", "n2"]),
    ("n[1, 2]", ["n1", "n02"]),
    ("n[18446744073709551616]", ["n18446744073709551615"]),
    ("gpu-[001-004,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("a[1-2][3-4]", ["a13", "a14", "a23", "a24"]),
    ("n[1-2]-[3-4]", ["n1-3", "n1-4", "n2-3", "n2-4"]),
    ("[1-2]", ["1", "2"]),
    ("[1]-[2]", ["1-2"]),
    ("n[1,2]x[3,4]", ["n1x3", "n1x4", "n2x3", "n2x4"]),
    ("n[1, 2]x[3, 4]", ["n1x3", "n1x04", "n02x3", "n02x04"]),
    ("a[1-2]b[3-4]c[5-6]", ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
    ("a[1-2]b[3-4]c[5-6]d[7]", ["a1b3c5d7", "a2b3c5d7", "a1b4c5d7", "a2b4c5d7",
                                "a1b3c6d7", "a2b3c6d7", "a1b4c6d7", "a2b4c6d7"]),
    ("a]", ["a]"]),
    ("a]b[1]", ["a]b1"]),
    ("a]b[c[1]", ["a]b[c1"]),
    ("a[1]b[c[2]", ["a[1]b[c2"]),
    ("0[[01-2]", ["0[01", "0[02"]),
    ("a\nb", ["a\nb"]),
    ("rack[1-2]-node[01-02],x", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02", "x"]),
]

INVALID = [
    "node[5-3]", "n[10-9]", "n[]", "n[a-b]", "n[1-2]]", "n[1-3,5]x", "x[1-3]y", "n[1-2]-b", "n[1-2].dom",
    "n[-2]", "n[-1--2]", "n[1-2-3]", "n[1,]", "n[,1]", "n[1,,2]", "n[1-2,3 ]", "n[0x1]", "n[1x-2]",
    "n[1-1e2]", "a[]b[1]", "a[1]b[]", "a[x]b[1]", "x[1]y]z[2]", "a[1-2]b]", "n[0-65536]", "n[0-999999]",
    "n[1-2]\ny", "a[1-2]b[3-4]c",
    # Slurm 22.05 mangles an unclosed '[' into a host that does not exist ("n[1-2" -> "n]"); we refuse.
    "n[1-2", "n[", "n1,n[2", "[",
]


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


@settings(max_examples=400, deadline=None)
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


@settings(max_examples=200, deadline=None)
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


# --- against Slurm's own tool -------------------------------------------------------------------------

def _scontrol(expr: str, conf: str) -> list[str] | None:
    # scontrol exits 0 on an invalid list and only prints an error: read its output, not its status.
    r = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True,
                       env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})
    if "Invalid hostlist" in r.stdout + r.stderr or "error" in r.stderr:
        return None
    return r.stdout.split("\n")[:-1] if r.stdout else []


@pytest.fixture(scope="module")
def scontrol_conf(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("scontrol") is None:
        from tests.conftest import skip_or_fail

        skip_or_fail("scontrol is not installed (apt-get install slurm-client)")
    conf = tmp_path_factory.mktemp("sconf") / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return str(conf)


# scontrol prints hosts one per line, so a host holding a newline cannot be compared through it.
@pytest.mark.parametrize(("expr", "hosts"), [(e, h) for e, h in VALID if "\n" not in e])
def test_table_agrees_with_scontrol(expr: str, hosts: list[str], scontrol_conf: str) -> None:
    assert _scontrol(expr, scontrol_conf) == hosts


def test_random_expressions_agree_with_scontrol(scontrol_conf: str) -> None:
    rng = random.Random(20261130)
    alphabet = list("ab0123-,[] ") + ["[1-3]", "[01-2]", "n", "[0,2]", "x", "\t", "+", "05"]
    checked = 0
    for _ in range(300):
        expr = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        if expr.startswith("-"):
            continue  # scontrol would read it as an option
        expected = _scontrol(expr, scontrol_conf)
        try:
            ours: list[str] | None = hostlist.expand(expr)
        except HostlistError as e:
            ours = None
            if expected is not None:
                assert "without ']'" in str(e), (expr, expected)  # only our documented deviation
                continue
        assert ours == expected, expr
        checked += 1
    assert checked > 150
