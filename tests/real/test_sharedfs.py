"""The dev cluster's latency file system (issue 42): a directory served over SFTP from the hub namespace,
mounted with sshfs in a node's namespace, each request held D ms each way and counted on the server side.
The oracles: the bytes a reader gets through the mount, the kernel's mount table, and a lower bound on the
time a known number of round trips must take (the delay only adds; the bound cannot fail from load).

These need root, iproute2, sshfs and /dev/fuse; they skip without, and fail instead under CI=true."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import netns, sharedfs
from slurmlaunch.app.devcluster import slurm as devcluster
from tests.helpers import skip_or_fail

pytestmark = pytest.mark.slurm

DELAY_MS = 20.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the served directory, its mount on node 1), the network and the processes removed afterwards."""
    why = devcluster.missing_requirements(netns=True) or sharedfs.missing_requirements()
    if why:
        skip_or_fail(why)
    root = tmp_path / "cluster"
    export = tmp_path / "export"
    export.mkdir()
    net = netns.make_network(root, nodes=1)
    try:
        sharedfs.serve(root, net, DELAY_MS)
        mnt = tmp_path / "mnt"
        sharedfs.mount(root, net, 1, str(export), mnt)
        yield export, mnt
    finally:
        sharedfs.stop(root)
        netns.remove_network(root)
    assert not os.path.ismount(tmp_path / "mnt")


def _wait_counts(root: Path, enough: Callable[[sharedfs.Served], bool]) -> sharedfs.Served:
    """The server's counts once ``enough`` holds (it writes them every 0.2 s), or after 10 s as they are."""
    deadline = time.monotonic() + 10
    while True:
        c = sharedfs.counts(root)
        if enough(c) or time.monotonic() > deadline:
            return c
        time.sleep(0.1)


def test_a_node_reads_a_file_through_the_latency_fs_and_every_request_is_counted(
        served: tuple[Path, Path], tmp_path: Path) -> None:
    export, mnt = served
    body = os.urandom(200_000)
    (export / "blob").write_bytes(body)
    assert os.path.ismount(mnt)
    assert (mnt / "blob").read_bytes() == body
    root = tmp_path / "cluster"
    c = _wait_counts(root, lambda c: c.data_bytes >= len(body))
    assert c.data_bytes == len(body), c
    assert c.requests.get("open") == 1 and c.requests.get("read", 0) >= 1, c
    before = c.total
    # names never seen before: sshfs's cache cannot answer them, each is one lookup on the server
    started = time.monotonic()
    for i in range(10):
        assert not (mnt / f"missing-{i}").exists()
    took = time.monotonic() - started
    c = _wait_counts(root, lambda c: c.total >= before + 10)
    assert c.total - before >= 10, c
    least = 10 * 2 * DELAY_MS / 1000
    assert took >= least, f"10 lookups took {took:.3f} s, less than 10 round trips of 2 x {DELAY_MS} ms"
