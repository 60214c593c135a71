import multiprocessing
import os
import time

from verifiers import synthetic
from verifiers.base import VerifierResult

NAME, VERSION = "synthetic", "crashes-1"
SELF_TEST = synthetic.SELF_TEST


def score(completion, reference):
    if multiprocessing.current_process().name != "MainProcess":  # only inside scoring workers
        kind = "crashes"
        if kind == "raises":
            raise RuntimeError("verifier exploded")
        if kind == "hangs":
            time.sleep(3600)
        if kind == "crashes":
            os._exit(13)
    return synthetic.score(completion, reference)
