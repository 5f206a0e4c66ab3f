"""Rank 1 of the watchdog benchmark: stands in for a rank importing torch (it sleeps for argv[1] seconds, nothing
listening at MASTER_PORT), then prints the CPU seconds its launcher's watchdog (its only child) used meanwhile."""

import os
import sys
import time

time.sleep(float(sys.argv[1]))
me = os.getpid()
children = [int(c) for t in os.listdir(f"/proc/{me}/task")
            for c in open(f"/proc/{me}/task/{t}/children").read().split()]
if len(children) != 1:
    sys.exit(f"expected the watchdog as the only child, found {children}")
with open(f"/proc/{children[0]}/stat", "rb") as f:
    fields = f.read().rsplit(b")", 1)[1].split()
print((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))  # utime + stime
