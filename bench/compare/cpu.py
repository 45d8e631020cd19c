"""CPU per batch on each side of a transport: how many microseconds of CPU
`rbd serve` and the Python learner each spend per 256-row batch of
`iter_samples`, next to the batch rate. bench/compare/run.py says how fast;
this says which side is the limit (on a 2-core machine, a side at ~1 core).

    /usr/bin/python3 bench/compare/cpu.py                          # cartpole, shm
    /usr/bin/python3 bench/compare/cpu.py --transport stream --workload atari

The buffer and rows are bench/compare's (run.py's Workload, compact_obs,
capacity 100,000 for cartpole, 20,000 for atari), filled once; then two
measurements of --seconds each. The server's CPU is read from
/proc/<pid>/stat around each, the learner's from time.process_time(); the
learner's includes the time it polls the arena while it waits.
"""

import argparse
import os
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (HERE, os.path.join(ROOT, "bench"), os.path.join(ROOT, "clients", "python"),
          os.path.join(ROOT, "clients", "python", "tests")):
    sys.path.insert(0, p)

import rbdserver  # noqa: E402
import run  # noqa: E402
from rbd_client import Client  # noqa: E402


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transport", default="shm", choices=["shm", "stream", "requests"])
    p.add_argument("--workload", default="cartpole", choices=sorted(run.WORKLOADS))
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args()
    capacity = 100_000 if a.workload == "cartpole" else 20_000
    w = run.Workload(a.workload)
    with rbdserver.Server() as srv:
        c = Client(srv.url)
        c.create_buffer("bench", w.spec(capacity))
        for t in range(capacity // run.BATCH + 1):
            c.extend("bench", w.rbd_rows(t * run.TICKS), stream="bench")
        with c.iter_samples("bench", run.BATCH, depth=2, transport=a.transport) as it:
            for _ in range(200):  # warm up
                next(it)
            for _ in range(2):
                s0, p0, n, t0 = cpu_seconds(srv.proc.pid), time.process_time(), 0, time.perf_counter()
                while time.perf_counter() - t0 < a.seconds:
                    sum(x.nbytes for x in next(it).values())
                    n += 1
                dt = time.perf_counter() - t0
                print("%s %s: %.0f batches/s, server %.1f us of CPU a batch, learner %.1f us"
                      % (a.workload, it.transport, n / dt, (cpu_seconds(srv.proc.pid) - s0) / n * 1e6,
                         (time.process_time() - p0) / n * 1e6))
        c.close()


if __name__ == "__main__":
    main()
