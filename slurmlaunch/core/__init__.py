"""The pure core: node lists, the distributed environment and its readers per launcher, the job request and
its validation, time/size parsing. Standard library only; no processes, no files (pyproject: import-linter).

The version lives here, at the bottom of the layers, so that every layer (the scripts' header) may read it."""

__version__ = "0.1.0"
