"""A plain receiver process for weight-group tests: joins a group, receives K updates, prints checksums.
python -m tests.support.weight_peer HOST PORT RANK WORLD GROUP PLAN_JSON UPDATES [exit | die_mid_update | ipc | ipc_hold]
(exit: leave right after joining; die_mid_update: SIGKILL itself after the first bucket of the first update;
ipc, ipc_hold HANDLE_JSON: read updates 1.. from the learner's shared buffer, acknowledging each — ipc_hold
never acknowledges the second)"""

import json
import sys

from transport.weights import WeightPlan, open_group, receive_buckets


def main() -> None:
    host, port, rank, world, group, plan_json, updates = sys.argv[1:8]
    mode = sys.argv[8] if len(sys.argv) > 8 else ""
    plan = WeightPlan(**json.loads(plan_json))
    pg, store = open_group(host, int(port), int(rank), int(world), group, 30.0 if mode.startswith("ipc") else 10.0)
    print("joined", flush=True)
    if mode == "exit":
        return
    if mode.startswith("ipc"):
        from transport.ipc import OpenedBuffer, acknowledge, await_shared, read_shared

        buf = OpenedBuffer(json.loads(sys.argv[9]))
        for v in range(1, int(updates) + 1):
            await_shared(pg, v)
            print("checksum", read_shared(buf.tensor, plan), flush=True)
            if mode == "ipc_hold" and v == 2:
                import time

                time.sleep(60)  # the test kills it
            acknowledge(pg, v, True)
        return
    def load(flat, first, last):
        if mode == "die_mid_update":  # after the first bucket of the first update
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)

    for _ in range(int(updates)):
        print("checksum", receive_buckets(pg, plan, load=load), flush=True)

if __name__ == "__main__":
    main()
