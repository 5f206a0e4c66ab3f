"""The dev clusters the tests and the docs use: a real Slurm (slurm.py) and a real OpenPBS (pbs.py)."""
