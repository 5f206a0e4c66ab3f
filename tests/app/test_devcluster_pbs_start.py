"""The PBS dev cluster's head-host start and pbs_db_utility's datastore race (seen in CI at load 13: PostgreSQL's
socket not there yet when createdb runs). The failure text is OpenPBS's own (/opt/pbs/libexec/pbs_db_utility);
PBS removes the half-made datastore itself, so only that failure is tried again, a bounded number of times."""

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
