"""The PBS dev cluster's head-host start and pbs_db_utility's datastore race (seen in CI at load 13: PostgreSQL's
socket not there yet when createdb runs). The failure text is OpenPBS's own (/opt/pbs/libexec/pbs_db_utility);
PBS removes the half-made datastore itself, so only that failure is tried again, a bounded number of times.
Then the server, which `pbs_init.d start` leaves still initializing on a busy machine: waited for while it
refuses connections, in bounded time."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import pbs
from slurmlaunch.core.errors import DevClusterError

RACE = ("starting the PBS head host: `pbs_init.d start` failed (exit 1): *** Error initializing the PBS "
        "dataservice\ncreatedb: error: connection to server on socket \"/var/run/postgresql/.s.PGSQL.15007\" "
        "failed: No such file or directory\nError creating PBS datastore")


def starts(monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_in(root: Path, host: str, argv: list[str], what: str, timeout: float) -> str:
        calls.append(argv)
        if failures:
            raise DevClusterError(failures.pop(0))
        return ""

    monkeypatch.setattr(pbs, "_in", fake_in)
    return calls


def test_the_datastore_race_is_tried_again_and_said(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = starts(monkeypatch, [RACE, RACE])
    pbs._start_head(Path("/nonexistent"), "pbs_init.d", 10)
    assert calls == [["pbs_init.d", "start"]] * 3
    err = capsys.readouterr().err
    assert err.count("starting the head host again") == 2 and "(3 of 3)" in err


def test_the_race_every_time_ends_in_bounded_tries_with_pbs_words(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = starts(monkeypatch, [RACE] * 5)
    with pytest.raises(DevClusterError) as e:
        pbs._start_head(Path("/nonexistent"), "pbs_init.d", 10)
    assert len(calls) == pbs.HEAD_START_TRIES
    assert "Error creating PBS datastore" in str(e.value) and f"try 3 of {pbs.HEAD_START_TRIES}" in str(e.value)


def test_any_other_failure_is_said_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = starts(monkeypatch, ["starting the PBS head host: `pbs_init.d start` failed (exit 1): pbs_server: "
                                 "License error"])
    with pytest.raises(DevClusterError, match="License error"):
        pbs._start_head(Path("/nonexistent"), "pbs_init.d", 10)
    assert len(calls) == 1


# What qstat says while pbs_server is not listening (real: tests/real/test_devcluster_pbs.py injects it)
REFUSED = ("asking the PBS server: `qstat -B` failed (exit 2): Connection refused\n"
           "qstat: cannot connect to server head (errno=15010)")


def test_the_server_is_waited_for_until_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = starts(monkeypatch, [REFUSED, REFUSED])
    pbs._wait_server(Path("/nonexistent"), 10)
    assert len(calls) == 3 and all(argv[-1] == "-B" for argv in calls)


def test_a_server_that_never_answers_is_said_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = starts(monkeypatch, [REFUSED] * 1000)
    with pytest.raises(DevClusterError) as e:
        pbs._wait_server(Path("/nonexistent"), 1)
    assert "the PBS server on head did not accept a connection within 1s" in str(e.value), e.value
    assert "Connection refused" in str(e.value) and 2 <= len(calls) <= 10


def test_any_other_answer_of_the_server_is_said_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = starts(monkeypatch, ["asking the PBS server: `qstat -B` failed (exit 1): qstat: Unauthorized Request"])
    with pytest.raises(DevClusterError, match="Unauthorized Request"):
        pbs._wait_server(Path("/nonexistent"), 10)
    assert len(calls) == 1
