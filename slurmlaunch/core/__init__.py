"""The pure core: node lists, the distributed environment and its readers per launcher, the job request and
its validation, time/size parsing. Standard library only (pyproject: import-linter); no processes, no files,
and the process's state comes in as arguments, with one exception: paths.py's per-user directories take
os.environ when the caller gives no mapping, and the home directory from os.path.expanduser (HOME, else the
password database). tests/core/test_spec.py keeps every other module free of both.

The version lives here, at the bottom of the layers, so that every layer (the scripts' header) may read it."""

__version__ = "0.1.0"

# The launcher's RUNNER leaves RANK + this in a job's returned-marks directory, holding the status of a
# sys.exit(N), N != 0; JobFiles.exit_mark names the file. Here, not in jobfiles.py, for the same reason as the
# version, and because the launcher's path (every rank) then needs no class of names built.
EXIT_MARK_SUFFIX = ".exit"

# The stacks directory (JobFiles.stacks, $SLURMLAUNCH_STACKS_DIR) holds, per rank, RANK + these: the pid file the
# RUNNER writes ("PID START HOST"), the dump on demand (`slurmlaunch stacks`) and the dump at a stop signal.
# Here for the same reason as EXIT_MARK_SUFFIX: the RUNNER spells them without importing a class.
STACKS_PID_SUFFIX = ".pid"
STACKS_DUMP_SUFFIX = ".dump"
STACKS_STOP_SUFFIX = ".stopped"
# the stack where the script ended with an exception (a peer stopped first broke its all_reduce): a stop that comes
# after finds the rank in its teardown, with no frame of the job's, so the summary takes this instead
STACKS_ENDED_SUFFIX = ".ended"
STACKS_SUMMARY_NAME = "summary"  # the grouped stacks saved at the stop, one line per group

# The variables a PBS job resubmitted at the warning carries (qsub -v, allocation/batch_step.py): which run it is
# (0 for the first; the ranks see it, as SLURM_RESTART_COUNT under Slurm), and the first job's full id, whose
# files and output file are the whole chain's (a resubmission has an id of its own; Slurm's requeue keeps it).
RESTART_COUNT = "SLURMLAUNCH_RESTART_COUNT"
REQUEUE_OF = "SLURMLAUNCH_REQUEUE_OF"
