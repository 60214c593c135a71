"""Takes 3 s to import (a heavy dependency on a loaded machine), then scores as the synthetic verifier."""

import time

from verifiers import synthetic

time.sleep(3.0)
NAME, VERSION = "synthetic", "slow-import-1"
SELF_TEST = synthetic.SELF_TEST
score = synthetic.score
