"""The floor of one control-plane hop on this machine: the round trip of a trivial
unary RPC (the coordinator's Status, with no agent joined) from the Python client,
back to back (2000 times, twice) and after the processes sat idle for 2 and 10 ms
(500 times each), as they do while a sync's bytes move or between training steps. A
sync makes two such hops once the agents hold the schedule (client -> coordinator,
Execute to each agent), so their sum bounds what `sync()` costs beyond the agents' work.
  python3 bench/sync/rpc_rtt.py BIN     (BIN: the portable binaries, dist/bin)
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

import shardsync


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "dist/bin"
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "c.port")
        coordinator = subprocess.Popen([os.path.join(bin_dir, "shardsync-coordinator"), "--world", "1", "--listen",
                                        "127.0.0.1:0", "--port-file", port_file, "--insecure"],
                                       stderr=subprocess.DEVNULL)
        try:
            for _ in range(1000):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                time.sleep(0.01)
            client = shardsync.CoordinatorClient(f"127.0.0.1:{int(open(port_file).read())}", insecure=True)
            for label, idle, count in (("status", 0, 2000), ("status again", 0, 2000),
                                       ("status after 2 ms idle", 0.002, 500), ("status after 10 ms idle", 0.01, 500)):
                times = []
                for _ in range(count):
                    time.sleep(idle)
                    start = time.perf_counter()
                    client.status()
                    times.append(time.perf_counter() - start)
                times.sort()
                print(f"{label}: median {statistics.median(times) * 1e3:.3f} ms, p10 {times[len(times) // 10] * 1e3:.3f}, "
                      f"p90 {times[len(times) * 9 // 10] * 1e3:.3f}")
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
