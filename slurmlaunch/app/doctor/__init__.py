"""The doctor: the command (command.py) and the probe job it sends (probe.py)."""
