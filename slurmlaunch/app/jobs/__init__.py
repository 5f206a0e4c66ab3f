"""The job commands (commands.py: status, logs, list, cancel), following a job, its record, stacks, faults."""
