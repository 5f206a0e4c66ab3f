"""One error family. Messages say what was wrong, the value, and what would be right."""

from __future__ import annotations


class SlurmLaunchError(Exception):
    """Base of every error slurmlaunch raises on purpose; the CLI prints it as one line, exit code 2."""

    exit_code = 2


class HostlistError(SlurmLaunchError):
    """A node-list expression Slurm would reject."""


class EnvironmentMappingError(SlurmLaunchError):
    """A scheduler or launcher variable that is malformed or inconsistent with the others."""


class SpecError(SlurmLaunchError):
    """A job request that is invalid before anything is submitted."""


class SchedulerError(SlurmLaunchError):
    """The scheduler refused or failed a command; the message carries the command and its output."""


class PreflightError(SlurmLaunchError):
    """A check before exec failed (port not bindable, rank 0 on the wrong host, too few GPUs)."""


class JobStateError(SlurmLaunchError):
    """A job command about a job that is not known here, or not in a state that allows it (its record is
    gone, no such array element, its local supervisor is gone, no log yet). Not a bad request: the same
    command may succeed later or elsewhere."""


class DevClusterError(SlurmLaunchError):
    """The development cluster (slurmlaunch dev-cluster, the tests' cluster) could not be started, checked
    or stopped: a missing requirement, a daemon that did not come up, something `down` could not remove."""


class WaitTimeout(SchedulerError):
    """--wait-timeout passed while the job still runs: not a bad request, so not exit code 2 (124, as
    timeout(1) reports a command it stopped waiting for)."""

    exit_code = 124
