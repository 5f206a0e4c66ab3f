"""Where the suite's CPU goes: the CPU seconds each test took, its own and every process it started.

On two cores the suite is bound by CPU, not by the clusters' timers (tests/run.sh prints how idle the CPUs were),
so the tests that cost the most wall time are not those that cost the most CPU. Each xdist worker moves itself
into an accounting cgroup of its own (cgroup v1 ``cpuacct``, else v2 ``cpu.stat``; accounting only, the
scheduler's shares are untouched). Everything it starts (its clusters' daemons, the ranks they start, the CLI,
the local scheduler's detached jobs) inherits it, so the cgroup's usage across one test is that test's CPU, plus
the little its worker's idle clusters spend meanwhile. Only with SLURMLAUNCH_TEST_CPU_DIR set (tests/run.sh sets
it): then each worker writes its tests' CPU there and the run's summary lists the costliest and the workers'
total. Needs root and a cgroup file system; elsewhere it measures nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PREFIX = "slurmlaunch-tests-"
V1 = Path("/sys/fs/cgroup/cpuacct")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
TOP = 25


class Account:
    """One cgroup of this process's own, and its CPU so far in seconds."""

    def __init__(self) -> None:
        self.root, self.usage_file, self.scale = self._pick()
        self.group = self.root / f"{PREFIX}{os.getpid()}"
        self._sweep()
        self.group.mkdir()
        (self.group / "cgroup.procs").write_text(f"{os.getpid()}\n")

    @staticmethod
    def _pick() -> tuple[Path, str, float]:
        if (V1 / "cpuacct.usage").is_file():
            return V1, "cpuacct.usage", 1e-9
        for root in V2_ROOTS:
            if (root / "cgroup.controllers").is_file() and (root / "cpu.stat").is_file():
                return root, "cpu.stat", 1e-6
        raise OSError("no cgroup with CPU accounting")

    def _sweep(self) -> None:
        """Empty groups a killed run left behind (a group with processes in it stays: rmdir refuses it)."""
        for old in self.root.glob(PREFIX + "*"):
            try:
                old.rmdir()
            except OSError:
                pass

    def cpu_s(self) -> float:
        text = (self.group / self.usage_file).read_text()
        if self.usage_file == "cpu.stat":
            text = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec "))
        return int(text) * self.scale

    def close(self) -> None:
        """Back to the root group; the group goes once nothing started from it is left."""
        try:
            (self.root / "cgroup.procs").write_text(f"{os.getpid()}\n")
            self.group.rmdir()
        except OSError:
            pass


class CpuPlugin:
    def __init__(self, out_dir: Path | None, runs_tests: bool) -> None:
        self.out_dir = out_dir
        self.account: Account | None = None
        self.records: list[dict[str, object]] = []
        if runs_tests:
            try:
                self.account = Account()
            except OSError:  # not root, or no cgroup file system: nothing is measured
                self.account = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[object]:
        if self.account is None:
            return (yield)
        cpu0, wall0 = self.account.cpu_s(), time.monotonic()
        result = yield
        self.records.append({"id": item.nodeid, "cpu": round(self.account.cpu_s() - cpu0, 2),
                             "wall": round(time.monotonic() - wall0, 2)})
        return result

    def pytest_sessionfinish(self) -> None:
        if self.account is None:
            return
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            name = os.environ.get("PYTEST_XDIST_WORKER", "main")
            total = self.account.cpu_s()
            (self.out_dir / f"{name}.json").write_text(json.dumps({"total": total, "tests": self.records}))
        self.account.close()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.out_dir is None or os.environ.get("PYTEST_XDIST_WORKER") is not None:
            return
        workers = [json.loads(p.read_text()) for p in sorted(self.out_dir.glob("*.json"))]
        if not workers:
            return
        tests = sorted((t for w in workers for t in w["tests"]), key=lambda t: -float(t["cpu"]))
        total = sum(float(w["total"]) for w in workers)
        in_tests = sum(float(t["cpu"]) for t in tests)
        terminalreporter.write_sep("=", f"CPU seconds per test (tests/cpu_account.py), the {TOP} costliest")
        for t in tests[:TOP]:
            terminalreporter.write_line(f"{float(t['cpu']):8.1f} s CPU {float(t['wall']):7.1f} s wall  {t['id']}")
        terminalreporter.write_line(f"the workers' processes: {total:.0f} CPU s in all, {in_tests:.0f} s of it "
                                    f"inside tests, over {len(tests)} tests")


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("SLURMLAUNCH_TEST_CPU_DIR")
    # under -n N the controller only hands out tests: its workers measure, it sums up. Unasked (the variable
    # unset), no process is moved into a cgroup.
    controller = bool(getattr(config.option, "numprocesses", None)) and "PYTEST_XDIST_WORKER" not in os.environ
    config.pluginmanager.register(CpuPlugin(Path(out) if out else None, runs_tests=bool(out) and not controller),
                                  "slurmlaunch-cpu-account")
