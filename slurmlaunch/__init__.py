"""slurmlaunch: multi-node PyTorch on Slurm without hand-written batch scripts.

Importing the package is cheap on purpose: the launcher runs once per rank.
"""

__version__ = "0.1.0"
