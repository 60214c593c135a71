"""A hostile peer: sends random and mutated frames to the learner's ROUTER and PULL sockets.
Run as a separate process by tests/test_zmq_transport.py:  python -m tests.support.fuzz_peer WORK_URL ROLLOUT_URL COUNT"""

import random
import sys

import zmq

from tests.support.transport_helpers import make_group
from transport import wire


def mutated(rng: random.Random) -> list[bytes]:
    r = rng.random()
    if r < 0.3:  # random frames
        return [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 9))]
    frames = [bytes(f) for f in wire.encode(make_group(f"fuzz:{rng.randint(0, 10**9)}", n=3, length=4))]
    if r < 0.5:  # valid header, wrong kind of body / truncated lists
        return frames[: rng.randint(1, len(frames) - 1)]
    i = rng.randrange(len(frames))
    b = bytearray(frames[i])
    for _ in range(rng.randint(1, 6)):
        if b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    frames[i] = bytes(b[: rng.randint(0, len(b))] if rng.random() < 0.3 else b)
    return frames


def main(work_url: str, rollout_url: str, count: int) -> None:
    rng = random.Random(1234)
    ctx = zmq.Context()
    dealer, push = ctx.socket(zmq.DEALER), ctx.socket(zmq.PUSH)
    for s in (dealer, push):
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.setsockopt(zmq.LINGER, 5000)
    dealer.connect(work_url)
    push.connect(rollout_url)
    for _ in range(count):
        push.send_multipart(mutated(rng))
        dealer.send_multipart(mutated(rng))
    dealer.close()
    push.close()
    ctx.term()
    print("sent", count)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
