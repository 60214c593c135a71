"""The actor's verifiers: self-tested when the actor starts, swapped only when allowed and self-tested.

No verifier code runs in the actor's own process: import and self-test happen in a separate, time-limited
process (`verifiers.check`), scoring in the scoring pool's worker processes. A swap must match
`verifiers.allowed_modules`; a rejected swap leaves the verifier in force and says why.
"""

from __future__ import annotations

import logging
import os

from config.schema import BrorlConfig
from verifiers.check import allowed, check
from verifiers.datasets import verifier_names
from verifiers.registry import Registry, VerifierLoadError
from verifiers.sandbox import UNSAFE_ENV

log = logging.getLogger("brorl.actor")
EXIT_REFUSED = 78  # EX_CONFIG: `brorl actor` cannot work as configured; restarting it would not help


class ActorRefused(RuntimeError):
    """The actor cannot work as configured (a verifier failed its start-up self-test)."""


class ActorVerifiers:
    def __init__(self, cfg: BrorlConfig):
        self.cfg = cfg
        self.registry = Registry()

    async def self_test(self) -> None:
        """Every verifier the configured tasks use must pass its self-test — through the code path scoring
        takes (for `code`: the real sandbox) — or the actor refuses to start, with the reason."""
        v = self.cfg.verifiers
        os.environ[UNSAFE_ENV] = "1" if v.sandbox_unsafe else "0"  # what the verifier processes inherit
        for name in sorted(verifier_names(v.task, self.cfg.run.seed, v.difficulty)):
            path = self.registry.path(name)
            if path is None:
                raise ActorRefused(f"the tasks use verifier {name!r}, which is not registered")
            try:
                self.registry.adopt(name, await check(path, v.check_timeout_s))
            except VerifierLoadError as e:
                raise ActorRefused(f"verifier {name!r} failed its start-up self-test: {e}") from None

    async def swap(self, name: str, path: str) -> str:
        """Make `path` the verifier for `name`; "" on success, else why not (the old one stays)."""
        patterns = self.cfg.verifiers.allowed_modules
        if not allowed(path, patterns):
            return f"swap {name} -> {path} refused: not in verifiers.allowed_modules {patterns}"
        try:
            self.registry.adopt(name, await check(path, self.cfg.verifiers.check_timeout_s))
        except VerifierLoadError as e:
            return f"swap {name} -> {path} rejected: {e}"
        return ""
