"""The least a launcher can be: exec the script with this interpreter, nothing else. benchmarks/run.py's
startup-cpu section starts it as `python -m floor_launcher SCRIPT` and as `python floor_launcher.py SCRIPT`:
the floor of any launcher started each way (a second interpreter start, plus runpy's imports under -m)."""

import os
import sys

os.execv(sys.executable, [sys.executable, "-u", *sys.argv[1:]])
