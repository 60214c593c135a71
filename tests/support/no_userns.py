"""Run a command the way Docker's default seccomp profile would: namespaces cannot be created.

    python -m tests.support.no_userns COMMAND [ARGS...]

Installs a seccomp filter (x86_64 and aarch64) that fails `unshare` and namespace-creating `clone` with
EPERM and `clone3` with ENOSYS (as Docker's profile does without CAP_SYS_ADMIN), then execs COMMAND.
"""

import ctypes
import os
import platform
import struct
import sys

ARCH = {"x86_64": (0xC000003E, {"unshare": 272, "clone": 56, "clone3": 435}),
        "aarch64": (0xC00000B7, {"unshare": 97, "clone": 220, "clone3": 435})}
NAMESPACE_FLAGS = 0x10000000 | 0x00020000 | 0x40000000 | 0x20000000 | 0x04000000 | 0x08000000 | 0x02000000
LD_ABS_W, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38


def ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def install() -> None:
    arch, nr = ARCH[platform.machine()]
    prog = [
        ins(LD_ABS_W, 0, 0, 4), ins(JEQ, 0, 8, arch),          # other arch: allow (index 10)
        ins(LD_ABS_W, 0, 0, 0),
        ins(JEQ, 0, 1, nr["clone3"]), ins(RET, 0, 0, ERRNO | ENOSYS),
        ins(JEQ, 0, 1, nr["unshare"]), ins(RET, 0, 0, ERRNO | EPERM),
        ins(JEQ, 0, 3, nr["clone"]),
        ins(LD_ABS_W, 0, 0, 16), ins(JSET, 0, 1, NAMESPACE_FLAGS), ins(RET, 0, 0, ERRNO | EPERM),
        ins(RET, 0, 0, ALLOW),
    ]
    buf = ctypes.create_string_buffer(b"".join(prog))
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    fbuf = ctypes.create_string_buffer(fprog)
    if libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
