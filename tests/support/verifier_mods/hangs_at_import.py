"""Never finishes importing: must be rejected after the check's time limit."""

import time

time.sleep(3600)
