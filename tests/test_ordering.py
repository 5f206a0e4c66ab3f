"""tests/ordering.py: the known-slow tests are handed out first under xdist, and its table names real tests."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT
from tests.ordering import SLOW_S, plain_id, slow_first

# A collection as a worker would make it (config.workerinput set before the hooks run), printed in its final order
COLLECT = """
import json, sys, pytest
class AsAWorker:
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        if sys.argv[1] == "worker":
            config.workerinput = {}
    def pytest_collection_finish(self, session):
        print("ORDER " + json.dumps([[i.nodeid, i.get_closest_marker("xdist_group") is not None]
                                     for i in session.items]))
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[AsAWorker()]))
"""


def collected(as_worker: bool) -> list[tuple[str, bool]]:
    files = sorted({nodeid.split("::", 1)[0] for nodeid in SLOW_S})
    r = subprocess.run([sys.executable, "-c", COLLECT, "worker" if as_worker else "plain", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ORDER " in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    return [(nodeid, grouped) for nodeid, grouped in json.loads(r.stdout.split("ORDER ", 1)[1].splitlines()[0])]


def test_every_slow_id_is_a_test_of_no_group_and_a_worker_takes_them_first() -> None:
    plain = collected(as_worker=False)
    groups = dict(plain)
    missing = [nodeid for nodeid in SLOW_S if nodeid not in groups]
    assert not missing, f"tests/ordering.py names tests that are gone (renamed?): {missing}"
    grouped = [nodeid for nodeid in SLOW_S if groups[nodeid]]
    assert not grouped, f"tests/ordering.py names tests of an xdist_group (their group places them): {grouped}"
    place = {nodeid: i for i, (nodeid, _) in enumerate(plain)}
    slowest_first = sorted(SLOW_S, key=lambda nodeid: (-SLOW_S[nodeid], place[nodeid]))  # a tie: as collected
    worker = [nodeid for nodeid, _ in collected(as_worker=True)]
    assert worker[:len(SLOW_S)] == slowest_first, worker[:len(SLOW_S)]
    assert sorted(worker) == sorted(nodeid for nodeid, _ in plain)  # the same tests, only their order
    assert [nodeid for nodeid, _ in plain][:len(SLOW_S)] != slowest_first  # -n 0: the files' own order


def test_slow_first_keeps_groups_and_the_rest_in_collection_order() -> None:
    by_time = sorted(SLOW_S, key=SLOW_S.__getitem__)
    least, other, slowest = by_time[0], by_time[1], by_time[-1]
    quick = "tests/core/test_x.py::test_quick"
    ids = [quick, f"{least}@netns-slurm", "tests/a.py::test_one", other, f"{slowest}@g[x]", slowest,
           "tests/b.py::test_two"]
    grouped = [False, True, False, False, False, False, False]
    order = [ids[i] for i in slow_first(ids, grouped)]
    # the ungrouped slow ones first, slowest first; then the rest as collected (a grouped one stays in place, and
    # an "@" inside a parameter is no group suffix)
    assert order == [slowest, other, quick, f"{least}@netns-slurm", "tests/a.py::test_one", f"{slowest}@g[x]",
                     "tests/b.py::test_two"]
    assert plain_id(f"{slowest}@netns-slurm") == slowest and plain_id("t.py::test[a@b]") == "t.py::test[a@b]"
