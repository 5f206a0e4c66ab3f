"""Batch-script templates shipped with slurmlaunch (installed as slurmlaunch/templates)."""
