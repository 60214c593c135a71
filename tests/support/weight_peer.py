"""A plain receiver process for weight-group tests: joins a group, receives K updates, prints checksums.
python -m tests.support.weight_peer HOST PORT RANK WORLD GROUP PLAN_JSON UPDATES [exit | die_mid_update]
(exit: leave right after joining; die_mid_update: SIGKILL itself after the first bucket of the first update)"""

import json
import sys

import torch

from transport.weights import WeightPlan, bucket_checksum, broadcast_bucket, combine_checksums, open_group


def main() -> None:
    host, port, rank, world, group, plan_json, updates = sys.argv[1:8]
    mode = sys.argv[8] if len(sys.argv) > 8 else ""
    plan = WeightPlan(**json.loads(plan_json))
    pg, store = open_group(host, int(port), int(rank), int(world), group, 10.0)
    print("joined", flush=True)
    if mode == "exit":
        return
    for _ in range(int(updates)):
        sums = []
        for _a, _b, n in plan.buckets:
            flat = torch.empty(n, dtype=torch.uint8)
            broadcast_bucket(pg, flat)
            sums.append(bucket_checksum(flat))
            if mode == "die_mid_update":
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
        print("checksum", combine_checksums(sums), flush=True)


if __name__ == "__main__":
    main()
