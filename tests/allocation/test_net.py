"""The network checks (allocation/net.py) on real sockets on 127.0.0.1, and the rendezvous bound's one parser
(core/rdzv.py) as the launcher and init_process_group read it."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import subprocess
import sys
import time

import pytest

from slurmlaunch.allocation import net, torch_helpers
from slurmlaunch.allocation.launch import rendezvous_timeout
from slurmlaunch.core.errors import SlurmLaunchError
from slurmlaunch.core.rdzv import DEFAULT_RDZV_TIMEOUT, parse_rendezvous_timeout


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def test_resolve_numeric_and_localhost() -> None:
    assert net.resolve("127.0.0.1") == ["127.0.0.1"]
    addresses = net.resolve("localhost")
    assert addresses and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    assert addresses == sorted(set(addresses))


def test_resolve_unknown_name_raises_oserror() -> None:
    with pytest.raises(OSError):
        net.resolve("no-such-host.invalid")


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1", "127.255.255.254", "::1", "::1%lo",
                                     "0:0:0:0:0:0:0:1", "::FFFF:127.0.0.1"])
def test_loopback(address: str) -> None:
    assert net.is_loopback(address)


@pytest.mark.parametrize("address", ["10.0.0.1", "128.0.0.1", "1.127.0.0", "::", "::2", "fe80::1%eth0",
                                     "::ffff:10.0.0.1", "2001:db8::1"])
def test_not_loopback(address: str) -> None:
    assert not net.is_loopback(address)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1", "::1", "0:0:0:0:0:0:0:1", "10.0.0.1", "::",
                                     "::2", "2001:db8::1", "128.0.0.1"])
def test_loopback_agrees_with_ipaddress(address: str) -> None:
    assert net.is_loopback(address) == ipaddress.ip_address(address).is_loopback


def test_all_loopback() -> None:
    assert net.all_loopback(["127.0.0.1", "::1"])
    assert not net.all_loopback(["127.0.0.1", "10.0.0.1"])
    assert not net.all_loopback([])  # nothing resolved is no proof of loopback


def test_bindable_sees_a_listener_and_its_end() -> None:
    s = listener()
    port = s.getsockname()[1]
    err = net.bindable(port)
    assert err is not None and err.errno == errno.EADDRINUSE
    s.close()
    assert net.bindable(port) is None


def test_free_port_is_bindable_and_not_zero() -> None:
    port = net.free_port()
    assert 0 < port < 65536
    assert net.bindable(port) is None


def test_a_held_port_goes_to_no_other_bind_yet_rank_0_listens_on_it() -> None:
    """The `run --standalone` and local-scheduler race (exit 78 under load): a port from bind(0) and close was
    drawn by another process's bind(0) before rank 0 listened. Held, no other process's bind(0) (here 3000
    asks in a child, many times the ephemeral range's 28000 ports' share) nor plain bind gets it, while rank 0's
    pre-flight and torch's TCPStore, which bind with SO_REUSEADDR, listen on it; closed, it is free again."""
    held = net.HeldPort()
    try:
        code = ("import socket\nseen = set()\nfor _ in range(3000):\n    s = socket.socket()\n"
                "    s.bind(('127.0.0.1', 0))\n    seen.add(s.getsockname()[1])\n    s.close()\n"
                f"print({held.port} in seen, len(seen))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
        assert out[0] == "False" and int(out[1]) > 100, out
        with socket.socket() as plain, pytest.raises(OSError) as refused:
            plain.bind(("127.0.0.1", held.port))
        assert refused.value.errno == errno.EADDRINUSE
        assert net.bindable(held.port) is None  # the pre-flight's check passes
        store = subprocess.run([sys.executable, "-c", (
            "import datetime, sys\ntry:\n    import torch.distributed as d\nexcept ImportError:\n    sys.exit(3)\n"
            f"s = d.TCPStore('127.0.0.1', {held.port}, 1, True, timeout=datetime.timedelta(seconds=20))\n"
            "s.set('k', 'v'); print(s.get('k').decode())")], capture_output=True, text=True, timeout=120)
        if store.returncode != 3:  # torch installed: its own store listens on the held port
            assert store.returncode == 0 and store.stdout == "v\n", store.stderr
    finally:
        held.close()
        held.close()  # again: a no-op
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", held.port))


def test_wait_listening_finds_a_listener() -> None:
    with listener() as s:
        assert net.wait_listening("127.0.0.1", s.getsockname()[1], time.monotonic() + 30, 0.05) is None


def test_wait_listening_gives_the_last_error_at_the_deadline() -> None:
    with socket.socket() as held:  # bound but not listening: connections are refused, and nobody takes the port
        held.bind(("127.0.0.1", 0))
        failed = net.wait_listening("127.0.0.1", held.getsockname()[1], time.monotonic() + 0.3, 0.05)
    assert failed == os.strerror(errno.ECONNREFUSED)


def test_wait_listening_retries_until_the_listener_comes() -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    calls = []

    def give_up() -> bool:  # after the first refused attempt, the master starts listening
        calls.append(1)
        if len(calls) == 2:
            held.listen(1)
        return False

    with held:
        assert net.wait_listening("127.0.0.1", held.getsockname()[1], time.monotonic() + 30, 0.01, give_up) is None
    assert len(calls) == 2


def test_wait_listening_gives_up_when_asked() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        assert net.wait_listening("127.0.0.1", held.getsockname()[1], time.monotonic() + 30, 0.01,
                                  lambda: True) == "given up"


@pytest.mark.parametrize(("text", "seconds"), [
    (None, DEFAULT_RDZV_TIMEOUT), ("", DEFAULT_RDZV_TIMEOUT), ("  ", DEFAULT_RDZV_TIMEOUT), ("0", 0.0),
    ("60", 60.0), ("1.5", 1.5), (" 2 ", 2.0), ("1e3", 1000.0), ("-0", 0.0),
])
def test_rendezvous_timeout_values(text: str | None, seconds: float) -> None:
    assert parse_rendezvous_timeout(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1", "-0.5", "nan", "inf", "-inf", "1s", "0x10", "²"])
def test_rendezvous_timeout_refusals(text: str) -> None:
    with pytest.raises(SlurmLaunchError) as e:
        parse_rendezvous_timeout(text)
    assert str(e.value) == f"SLURMLAUNCH_RDZV_TIMEOUT={text!r} is not valid (expected seconds >= 0; 0 = off)"


def test_launcher_and_helper_read_the_bound_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rendezvous_timeout({"SLURMLAUNCH_RDZV_TIMEOUT": "42"}) == 42.0
    monkeypatch.setenv("SLURMLAUNCH_RDZV_TIMEOUT", "42")
    assert torch_helpers.rendezvous_timeout_s(None) == 42.0
    assert torch_helpers.rendezvous_timeout_s(7.0) == 7.0
    monkeypatch.setenv("SLURMLAUNCH_RDZV_TIMEOUT", "soon")
    with pytest.raises(SlurmLaunchError, match="SLURMLAUNCH_RDZV_TIMEOUT='soon' is not valid"):
        rendezvous_timeout(os.environ)
    # init_process_group's reading was a raw ValueError from float() before there was one parser
    with pytest.raises(SlurmLaunchError, match="SLURMLAUNCH_RDZV_TIMEOUT='soon' is not valid"):
        torch_helpers.rendezvous_timeout_s(None)


def test_launcher_path_keeps_heavy_modules_out() -> None:
    """The launcher runs once per rank: the network checks must not pull `socket` (and selectors) in, nor
    the named records of the MPI table `typing` or `dataclasses` (each costs every rank milliseconds)."""
    heavy = "{'socket', 'selectors', 'typing', 'dataclasses', 'argparse', 'subprocess'}"
    code = f"import sys, slurmlaunch.allocation.launch; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
