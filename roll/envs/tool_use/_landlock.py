"""Run a command confined by Landlock: ``python -I -S _landlock.py RULES_JSON -- COMMAND...``.

Not imported by roll: :mod:`roll.envs.tool_use.sandbox` starts this file as a script, ahead of the sandbox's
bootstrap. Standard library only. It restricts itself with the Linux Landlock LSM (direct syscalls through
``ctypes``, so no package is needed) and then ``execv``s ``COMMAND``: the restriction holds for the new program and
everything it starts, and cannot be lifted. ``ctypes`` is loaded only here, never in the process that runs user
code (the ``exec`` replaces this interpreter).

``RULES_JSON`` is ``{"read": [paths], "exec": [paths], "write": [paths]}``: ``read`` paths (files or directory
trees) may be read and listed, ``exec`` paths also executed, ``write`` trees fully used (create, write, remove,
rename within). Everything else is denied: reading, listing, writing, executing; with ABI >= 4 also TCP bind and
connect; with ABI >= 6 signals to processes outside the sandbox and abstract Unix sockets. A path that does not
exist is skipped. Exit code 88 with one ``landlock: ...`` line on stderr when the restriction cannot be applied.

``python -I -S _landlock.py --abi`` prints the kernel's Landlock ABI version (0: unavailable) and exits.
"""

import json
import os
import sys

EXIT_SETUP = 88
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every Linux architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_AND_REMOVE = sum(1 << i for i in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # the rights a rule on a file may hold
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return ctypes, libc


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not built in, disabled, or filtered (seccomp)."""
    ctypes, libc = _libc()
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def handled_rights(abi: int) -> tuple[int, int, int]:
    """(filesystem rights, network rights, scopes) that ABI ``abi`` can restrict: all of them are handled."""
    fs = _EXECUTE | _WRITE_FILE | _READ_FILE | _READ_DIR | _MAKE_AND_REMOVE
    fs |= (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) | (_IOCTL_DEV if abi >= 5 else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    return fs, net, scoped


def restrict(rules: dict, abi: int) -> None:
    """Restrict this process (and what it execs) to ``rules``; raises OSError when a syscall fails."""
    ctypes, libc = _libc()
    fs, net, scoped = handled_rights(abi)

    class RulesetAttr(ctypes.Structure):
        _fields_ = [
            ("handled_access_fs", ctypes.c_uint64),
            ("handled_access_net", ctypes.c_uint64),
            ("scoped", ctypes.c_uint64),
        ]

    class PathBeneathAttr(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def check(result: int, what: str) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return result

    attr = RulesetAttr(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew with the ABI; older kernels want the old size
    ruleset = check(
        libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )
    read = _READ_FILE | _READ_DIR | (_IOCTL_DEV if abi >= 5 else 0)
    grants = [(p, read) for p in rules.get("read", ())] + [(p, read | _EXECUTE) for p in rules.get("exec", ())]
    grants += [(p, fs) for p in rules.get("write", ())]
    try:
        for path, rights in grants:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                allowed = rights if os.path.isdir(path) else rights & _FILE_RIGHTS
                rule = PathBeneathAttr(allowed & fs, fd)
                check(
                    libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)),
                    f"landlock_add_rule {path}",
                )
            finally:
                os.close(fd)
        check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        check(libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def main() -> None:
    if sys.argv[1:] == ["--abi"]:
        print(abi_version())
        return
    rules_json, separator, *command = sys.argv[1:]
    if separator != "--" or not command:
        sys.exit("usage: _landlock.py RULES_JSON -- COMMAND...")
    try:
        abi = abi_version()
        if abi < 1:
            raise OSError("Landlock is not available")
        restrict(json.loads(rules_json), abi)
    except OSError as exc:
        os.write(2, f"landlock: {exc}\n".encode())
        os._exit(EXIT_SETUP)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
