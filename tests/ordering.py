"""The order pytest-xdist's workers take the tests in: the known-slow tests first.

Under ``--dist loadgroup`` (tests/run.sh) the controller hands out work units (a test, or every test of one
xdist_group) in collection order, after the groups (sorted by size, xdist's --loadscope-reorder). A 130 s test
collected near the end starts when the other workers are nearly done and the run waits for it alone. Handing
the longest first (longest-processing-time-first scheduling) lets the short ones fill in around them.

The order is a fixed table, the same in every worker (xdist refuses workers whose collections differ), from
the call durations of a CI run (tests/run.sh prints the slowest). tests/test_ordering.py keeps it honest: each
id in it is still a test, and none is in an xdist_group (whose place the group decides, not this table).
Without xdist (-n 0) nothing is reordered: module-scoped fixtures stay shared by consecutive tests.
"""

from __future__ import annotations

import pytest

# node id (without xdist's "@group" suffix) -> seconds its call took in the clean-clone CI run of 2026-12-07
# (3 workers on 2 cores). Only the order matters; tests that grouped (netns-slurm,
# slurm_current) are left out: their group is one work unit, placed by its size.
SLOW_S: dict[str, int] = {
    "tests/real/test_benchmarks.py::test_benchmark_quick_run": 133,
    "tests/real/test_slurm_faults.py::test_status_and_cancel_while_slurmdbd_is_stalled_say_slurm_was_not_asked": 94,
    "tests/real/test_clients.py::test_pbs": 82,
    "tests/real/test_warning_unhandled.py::test_slurm_script_without_a_handler_runs_to_its_limit": 74,
    "tests/real/test_slurm_faults.py::test_wait_names_a_lost_node_and_slurms_requeue": 66,
    "tests/real/test_api_slurm_faults.py::test_a_hung_rank_at_the_time_limit_is_named": 66,
    "tests/app/test_stacks.py::test_slurm_time_limit_leaves_the_summary_in_the_batch_log": 61,
    "tests/allocation/test_rendezvous_styles.py::test_own_rendezvous_outlives_the_watchdog_locally": 56,
    "tests/real/test_clients.py::test_run_two_nodes": 54,
    "tests/real/test_stacks_pbs.py::test_pbs_walltime_leaves_the_summary_in_the_batch_log": 51,
    "tests/real/test_slurm_cluster.py::test_warning_signal_checkpoint_requeue_resume": 51,
    "tests/app/test_hostile.py::test_fuzz_every_option_with_hostile_values": 49,
    "tests/real/test_slurm_cluster.py::test_time_limit_requeues_at_most_max_requeues": 48,
    "tests/real/test_pbs_real_more.py::test_at_the_walltime_pbs_sends_no_warning": 44,
    "tests/allocation/test_rendezvous_styles.py::test_own_rendezvous_outlives_run_master_timeout": 44,
    "tests/real/test_doctor.py::test_probe_reports_an_unresolvable_master_within_its_bound": 42,
    "tests/real/test_remote_ship.py::test_example_trains_where_slurmlaunch_is_not_installed": 42,
    "tests/allocation/test_torchrun_mode.py::test_elastic_range_on_the_real_cluster": 42,
    "tests/real/test_clients.py::test_local_default": 42,
    "tests/real/test_job_identity.py::test_pbs_a_fresh_server_numbers_from_0_again": 42,
    "tests/app/api/test_api.py::test_slurm_function_two_nodes_two_tasks": 39,
    "tests/real/test_stacks_pbs.py::test_pbs_hung_job_stacks_then_qdel_leaves_the_summary": 39,
}


def plain_id(nodeid: str) -> str:
    """``nodeid`` without the "@group" suffix xdist's loadgroup adds (its own rule: an "@" after any "]")."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def slow_first(nodeids: list[str], grouped: list[bool]) -> list[int]:
    """The indices of ``nodeids`` in the order to hand them out: the ungrouped ones of :data:`SLOW_S`, slowest
    first, then every other one as collected (a stable sort: grouped tests keep their order among themselves)."""
    def key(i: int) -> int:
        return 0 if grouped[i] else -SLOW_S.get(plain_id(nodeids[i]), 0)

    return sorted(range(len(nodeids)), key=key)


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has put the shared clusters' tests in their groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing is handed out, keep the file order
        return
    order = slow_first([item.nodeid for item in items],
                       [item.get_closest_marker("xdist_group") is not None for item in items])
    items[:] = [items[i] for i in order]
