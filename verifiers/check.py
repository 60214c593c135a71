"""Import a verifier and run its self-test in a separate process, with a time limit.

    python -m verifiers.check PATH      (prints one result line; exit status 0 = accepted)

Import-time code of a verifier module runs only there: a module that raises (SystemExit included), hangs,
or fails its self-test is rejected with the reason, and the process that asked — the learner's event
loop, an actor — is untouched. `check(path, timeout_s)` is the asyncio side; `allowed(path, patterns)`
is the configured allow-list (`verifiers.allowed_modules`), checked before anything is imported.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import signal
import sys

from verifiers.registry import VerifierInfo, VerifierLoadError

MARK = "BRORL-VERIFIER-CHECK "


def allowed(path: str, patterns: list[str]) -> bool:
    """Does the module of `path` ("pkg.mod" or "pkg.mod:attr") match one of the allow-list patterns?"""
    module = path.partition(":")[0]
    return bool(module) and any(fnmatch.fnmatchcase(module, p) for p in patterns)


async def check(path: str, timeout_s: float) -> VerifierInfo:
    """Import `path` and run its self-test in a child process; raises VerifierLoadError (the reason) if it
    fails, exits, hangs past `timeout_s` (the child is killed) or prints no verdict."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "verifiers.check", path, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        _kill(proc.pid)
        await proc.wait()
        raise VerifierLoadError(f"{path}: import and self-test did not finish within {timeout_s:.0f} s "
                                f"(verifiers.check_timeout_s)") from None
    finally:
        _kill(proc.pid)  # anything it left behind in its session
    lines = [ln[len(MARK):] for ln in out.decode(errors="replace").splitlines() if ln.startswith(MARK)]
    verdict = json.loads(lines[-1]) if lines else None
    if proc.returncode == 0 and verdict and "error" not in verdict:
        return VerifierInfo(verdict["name"], verdict["version"], tuple(verdict["reward_range"]), path)
    why = (verdict or {}).get("error") or (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
    raise VerifierLoadError(f"{path}: rejected (exit status {proc.returncode}): {why}")


def _kill(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(path: str) -> int:
    from verifiers.registry import load, run_self_test

    try:
        v = load(path)
        run_self_test(v)
    except VerifierLoadError as e:
        print(MARK + json.dumps({"error": str(e)}), flush=True)
        return 1
    print(MARK + json.dumps({"name": v.name, "version": v.version, "reward_range": list(v.reward_range)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
