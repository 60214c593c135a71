"""One misbehaving verifier, parameterised by what it does wrong inside scoring workers."""

import multiprocessing
import os
import subprocess
import time

from verifiers import synthetic

CHILD_SLEEP_S = "3599.5"


def make(kind: str):
    def score(completion, reference):
        if multiprocessing.current_process().name != "MainProcess":  # only inside scoring workers
            if kind == "raises":
                raise RuntimeError("verifier exploded")
            if kind == "hangs":
                time.sleep(3600)
            if kind == "hangs_with_a_child":  # a process of its own, marked by its odd argument
                subprocess.Popen(["sleep", CHILD_SLEEP_S])
                time.sleep(3600)
            if kind == "crashes":
                os._exit(13)
        return synthetic.score(completion, reference)

    return score
