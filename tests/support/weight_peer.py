"""A plain receiver process for weight-group tests: joins a group, receives K updates, prints checksums.
python -m tests.support.weight_peer HOST PORT RANK WORLD GROUP PLAN_JSON UPDATES [exit | die_mid_update]
(exit: leave right after joining; die_mid_update: SIGKILL itself after the first bucket of the first update)"""

import json
import sys

from transport.weights import WeightPlan, open_group, receive_buckets


def main() -> None:
    host, port, rank, world, group, plan_json, updates = sys.argv[1:8]
    mode = sys.argv[8] if len(sys.argv) > 8 else ""
    plan = WeightPlan(**json.loads(plan_json))
    pg, store = open_group(host, int(port), int(rank), int(world), group, 10.0)
    print("joined", flush=True)
    if mode == "exit":
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
