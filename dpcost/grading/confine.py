"""Confine a child process that runs student code, and end it with everything it started.

``Confined(target, limits).start()`` forks two processes from the caller (the notebook's kernel
or the grader):

- the **keeper**, ours and never running student code: it starts a session of its own, unshares
  a new PID namespace (and mount and network namespaces), forks the worker into a memory cgroup
  of its own, tells the caller the worker's pid, and waits, watching the sandbox's memory; when
  the caller closes the control pipe (or dies), or when the sandbox's processes together pass
  ``Limits.memory_bytes``, it kills the worker and reaps it. Without namespaces it kills the
  worker's session, every process of the sandbox's user id and every descendant (it is their
  subreaper) instead, and removes what the sandbox's own uid left in /tmp, /var/tmp, /dev/shm.
- the **worker**, pid 1 of the new PID namespace: it mounts a /proc of its own namespace (so the
  kernel's processes are not even visible), covers /tmp, /var/tmp, /dev/shm and /run with empty
  tmpfs of its own (binding back only its folder and the folders Python imports from), hides
  the dpcost package's folder if asked, points every inherited file descriptor at /dev/null
  (ipykernel's sockets included), sends fds 1 and 2 to a pipe the caller reads, replaces the
  environment inherited from the kernel with the few variables Python needs (and blanks the
  copy that ``/proc/self/environ`` shows), sets resource limits, drops to an unprivileged user
  id when run as root (a uid of its own, ``UID_BASE`` + the keeper's pid, no groups,
  ``no_new_privs``), then calls ``target()``. Where a namespace is missing it installs an
  audit hook (:func:`_guard`) that refuses, at Python's level only, what the namespace would
  have kept out.

What that gives, where the system allows it (:func:`protections` says what is in force):

- the worker cannot signal, trace or open the files of the kernel, the keeper or another
  sandbox: another uid (root's processes are out of reach), another PID namespace (their pids
  do not exist there; and pid 1 itself cannot be killed from inside, a Linux rule);
- when the worker ends, or is killed, the kernel ends every process of its namespace, those in
  new sessions too; the keeper's kill is the caller's guarantee;
- address space, processes (threads count), CPU time and file size are limited by
  ``setrlimit``; core dumps are off;
- memory is bounded in total across all the sandbox's processes: by a memory cgroup where the
  keeper may make one (the kernel counts), otherwise by the keeper, which sums the processes'
  memory (:func:`_memory_used`) 20 times a second. Either way the whole sandbox is stopped and
  ``Confined.stopped_for`` says why, in one line;
- the worker's files stay in its folder: /tmp, /var/tmp, /dev/shm and /run are private tmpfs
  that vanish with the mount namespace; without one, TMPDIR points into the folder and the
  keeper removes afterwards what the sandbox's own uid created in those folders;
- no sockets but the sandbox's own: a network namespace with only a loopback, and /tmp and /run
  (where Unix sockets live) private.

Without root and without user namespaces only the limits, the memory watch, the audit hook and
the kill of every descendant remain, and the sandbox shares the kernel's uid
(docs/exercises.md says what protects what, where).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

UID_BASE = 1_900_000_000  # sandbox uid = UID_BASE + keeper pid: one uid per sandbox, no passwd

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x00020000, 0x10000000, 0x20000000,
                                                          0x40000000)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SETUP_TIMEOUT_S = 20.0  # the keeper and worker report within this, or the start failed
PR_SET_CHILD_SUBREAPER = 36
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # a tmpfs of the worker's over each
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # swept afterwards where they are not private
WATCH_S = 0.05  # how often the keeper looks at the sandbox's memory
# What the worker keeps of the kernel's environment (HOME and TMPDIR become its folder).
ENVIRONMENT_KEPT = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM",
                    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8",
                    "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONWARNINGS",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class Limits:
    """Resource limits of every process in the sandbox (``setrlimit``; units in the names).

    address_space_extra_bytes: virtual memory each process may map beyond what the caller had
    mapped when it forked (the child starts with the kernel's mappings); processes: tasks
    (processes and threads) of the sandbox's uid, enforced only where the uid is its own;
    cpu_s: CPU seconds per process; file_bytes: the largest file a process may write;
    memory_bytes: what all the sandbox's processes together may add to the memory they share
    with the caller when forked (a cgroup's limit, or the keeper's sum); tmp_bytes: what each
    private /tmp, /var/tmp, /dev/shm and /run may hold.
    """

    address_space_extra_bytes: int = 2**30
    processes: int = 64
    cpu_s: int = 60
    file_bytes: int = 16 * 2**20
    memory_bytes: int = 2 * 2**30
    tmp_bytes: int = 64 * 2**20


class SandboxError(RuntimeError):
    """The sandbox could not start (the message says which step failed)."""


def _libc_call(what: str, name: str, *args) -> None:
    """libc's ``name(*args)``; OSError naming ``what`` if it fails. (No CDLL object is kept in
    a frame the student's code could walk to: calling its attributes blindly segfaults.)"""
    if getattr(ctypes.CDLL(None, use_errno=True), name)(*args) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _vm_size_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def interrupts_deferred():
    """Hold SIGINT (Jupyter's Stop button) while the sandbox starts or is cleaned up, then raise
    KeyboardInterrupt: an interrupt never leaves a child, a pipe or a temp dir behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous) and previous is not signal.default_int_handler:
                previous(signal.SIGINT, None)
            else:
                raise KeyboardInterrupt


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Confined:
    """One confined worker running ``target()``; see the module's docstring.

    keep_fds: descriptors of the caller's that the worker keeps (say, a result pipe's writing
    end); hide_package: mount an empty folder over the dpcost package's folder in the worker;
    every other inherited descriptor points at /dev/null there; namespaces=False: do not try
    them, cgroup=False: make no memory cgroup (what a system without them gets; the tests use
    both).
    """

    def __init__(self, target, limits: Limits = Limits(), *, keep_fds=(), hide_package=False,
                 namespaces=True, cgroup=True):
        self.target, self.limits, self.namespaces = target, limits, namespaces
        self.cgroup = cgroup
        self.stopped_for = ""  # why the keeper stopped the sandbox early, in words ("" if not)
        self.keep_fds, self.hide_package = tuple(keep_fds), hide_package
        self.keeper_pid = self.pid = None
        self.pidfd = -1  # the worker's (not our child: the keeper's)
        self.output_fd = self.status_fd = self.control_fd = -1
        self.folder = None  # the worker's cwd, HOME and TMPDIR; removed by stop()
        self.protections: dict = {}
        self.exit_status: int | None = None  # the worker's: exit code, or -signal

    # ---- in the caller ----------------------------------------------------------------------
    def start(self) -> Confined:
        with interrupts_deferred():
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
        return self

    def _start(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="dpcost-sandbox-")
        setup_r, setup_w = os.pipe()
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        output_r, output_w = os.pipe()
        vm_size = _vm_size_bytes()
        pid = os.fork()
        if pid == 0:  # the keeper
            code = 1
            try:
                for fd in (setup_r, status_r, control_w, output_r):
                    os.close(fd)
                self._keeper(setup_w, status_w, control_r, output_w, vm_size)
                code = 0
            except BaseException:  # noqa: B036 - nothing may escape a forked child
                pass
            finally:
                os._exit(code)
        self.keeper_pid = pid
        for fd in (setup_w, status_w, control_r, output_w):
            os.close(fd)
        self.status_fd, self.control_fd, self.output_fd = status_r, control_w, output_r
        try:
            facts = self._read_setup(setup_r)
        finally:
            os.close(setup_r)
        if "error" in facts:
            raise SandboxError(f"the sandbox could not start: {facts['error']}")
        self.pid = facts.pop("pid")
        self.protections = facts
        os.set_blocking(self.output_fd, False)
        os.set_blocking(self.status_fd, False)

    def _read_setup(self, fd: int) -> dict:
        """The keeper's line (worker pid, namespaces), then the worker's (uid, limits)."""
        data, deadline = b"", time.monotonic() + SETUP_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return {"error": f"no answer within {SETUP_TIMEOUT_S:g} s"}
            chunk = os.read(fd, 4096)
            if not chunk or len(data) > 65536:
                break
            data += chunk
        facts = {}
        for line in data.splitlines():
            try:
                facts.update(json.loads(line))
            except ValueError:
                return {"error": "a malformed setup message"}
        if "pid" not in facts:
            return {"error": facts.get("error", "the keeper died")}
        if "error" not in facts and "uid" not in facts:
            facts["error"] = "the worker died while setting up"
        if "pid" in facts and "error" not in facts:
            try:
                self.pidfd = os.pidfd_open(facts["pid"])
            except OSError as exc:
                facts["error"] = f"pidfd_open: {exc}"
        return facts

    def poll(self) -> int | None:
        """The worker's exit status (code, or -signal) once the keeper has seen it exit."""
        if self.exit_status is None and self.status_fd >= 0:
            try:
                data = os.read(self.status_fd, 1024)
            except BlockingIOError:
                return None
            if data.strip():  # "CODE" or "CODE why it was stopped"
                code, _, reason = data.decode("utf-8", "replace").strip().partition(" ")
                self.exit_status, self.stopped_for = int(code), reason
        return self.exit_status

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            select.select([self.status_fd], [], [], max(0.0, deadline - time.monotonic()))
        return self.exit_status

    def stop(self) -> None:
        """Kill the worker and everything in its namespace (or session and uid); reap the keeper;
        remove the folder; close every descriptor. Safe to call twice, and after a failed start."""
        with interrupts_deferred():
            if self.pidfd >= 0:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            if self.control_fd >= 0:
                os.close(self.control_fd)  # the keeper's cue: kill, reap, leave
                self.control_fd = -1
            if self.keeper_pid is not None:
                deadline = time.monotonic() + 10
                while os.waitpid(self.keeper_pid, os.WNOHANG)[0] == 0:
                    if time.monotonic() > deadline:
                        os.kill(self.keeper_pid, signal.SIGKILL)
                        os.waitpid(self.keeper_pid, 0)
                        break
                    time.sleep(0.005)
                self.keeper_pid = None
            self.poll()
            for name in ("pidfd", "output_fd", "status_fd"):
                fd = getattr(self, name)
                if fd >= 0:
                    os.close(fd)
                    setattr(self, name, -1)
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None
            if self.protections.get("memory_cgroup"):  # the keeper's, unless it was killed
                _remove_cgroup(self.protections["memory_cgroup"])

    # ---- in the keeper (root or not; never runs student code) -------------------------------
    def _keeper(self, setup_w, status_w, control_r, output_w, vm_size) -> None:
        os.setsid()
        # The sandbox's orphans come to us, not to init: the memory watch and the kill find them
        _libc_call("subreaper", "prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        facts = {"pid_namespace": False, "user_namespace": False, "mount_namespace": False,
                 "network_namespace": False}
        uid = os.getuid()
        root = os.geteuid() == 0
        sandbox_uid = UID_BASE + os.getpid() if root else uid
        flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | (0 if root else CLONE_NEWUSER)
        try:
            if not self.namespaces:
                raise OSError(0, "namespaces not asked for")
            _libc_call("unshare", "unshare", flags)
            if not root:
                gid = os.getgid()
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"{uid} {uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"{gid} {gid} 1")
            _libc_call("mount private", "mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
            facts.update(pid_namespace=True, mount_namespace=True, network_namespace=True,
                         user_namespace=not root)
        except OSError as exc:
            facts["namespace_error"] = str(exc)
        limit = self.limits.memory_bytes
        cgroup = _make_cgroup(limit) if self.cgroup else None
        facts.update(memory_cgroup=cgroup[0] if cgroup else "", memory_bytes=limit)
        # Without a mount namespace /tmp, /var/tmp and /dev/shm are shared: note what is there
        shared_before = {} if facts["mount_namespace"] else _listing(SHARED_TMP)
        watch = _MemoryWatch(cgroup[0] if cgroup else None, limit, root)
        if cgroup:
            _write_file(f"{cgroup[0]}/cgroup.procs", "0")  # the worker is forked into it,
        pid = -1
        try:
            pid = os.fork()
        finally:
            if cgroup and pid != 0:
                _write_file(f"{cgroup[1]}/cgroup.procs", "0")  # and we leave it at once
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(status_w)
                os.close(control_r)
                self._worker(setup_w, output_w, root, sandbox_uid, vm_size, facts)
                code = 0
            except BaseException:  # noqa: B036
                pass
            finally:
                os._exit(code)
        os.close(output_w)
        for fd in self.keep_fds:  # the worker's now: the caller sees end-of-file when it ends
            with contextlib.suppress(OSError):
                os.close(fd)
        _write_all(setup_w, json.dumps({"pid": pid, **facts}).encode() + b"\n")
        os.close(setup_w)
        pidfd = os.pidfd_open(pid)
        reported, stopped = False, ""
        while True:
            ready = select.select([control_r] + ([] if reported else [pidfd]), [], [],
                                  WATCH_S)[0]
            if not stopped and watch.exceeded():
                stopped = (f"the sandbox's processes together used more than "
                           f"{limit / 2**20:.0f} MiB of memory, its limit: stopped")
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                if not facts["pid_namespace"]:
                    _sweep(pid, sandbox_uid if root else None)
            if pidfd in ready and not reported:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # not reaped yet
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                _write_all(status_w, f"{code} {stopped}".strip().encode() + b"\n")
                reported = True
            if control_r in ready:  # the caller closed it (done, or died): end it all
                break
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.waitpid(pid, 0)  # in a PID namespace: returns once every process in it is gone
        if not facts["pid_namespace"]:
            _sweep(pid, sandbox_uid if root else None)
        if root and not facts["mount_namespace"]:  # only a uid of its own tells its files apart
            _remove_new(shared_before, sandbox_uid)
        if cgroup:
            _remove_cgroup(cgroup[0])
        shutil.rmtree(self.folder, ignore_errors=True)  # also when the caller was killed

    # ---- in the worker (pid 1 of the namespace; runs the target) ----------------------------
    def _worker(self, setup_w, output_w, root, sandbox_uid, vm_size, facts) -> None:
        done = {"uid": os.getuid()}
        try:
            os.setsid()  # a session of its own: the sweep's handle where no namespace is
            if facts["pid_namespace"]:
                _libc_call("mount /proc", "mount", b"proc", b"/proc", b"proc",
                           MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            if facts["network_namespace"]:
                _loopback_up()  # the ranks' 127.0.0.1, apart from the kernel's
            if facts["mount_namespace"]:  # before hiding the package: it may live in /tmp
                done["private_tmp"] = _private_tmp(_python_paths() + [self.folder],
                                                   self.limits.tmp_bytes)
            if self.hide_package and facts["mount_namespace"]:
                import dpcost

                package = os.path.dirname(os.path.abspath(dpcost.__file__))
                _libc_call("hide the package", "mount", b"tmpfs", package.encode(), b"tmpfs",
                           MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k")
                done["package_hidden"] = True
            _redirect_fds(keep=set(self.keep_fds) | {setup_w}, output_fd=output_w)
            os.chdir(self.folder)
            _replace_environment(self.folder)
            tempfile.tempdir = None
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
            limits = self.limits
            extra = limits.address_space_extra_bytes
            # Tasks are counted per uid: limit them only where the uid counts the sandbox alone.
            own_uid = root or facts["user_namespace"]
            for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", limits.file_bytes),
                                ("RLIMIT_CPU", limits.cpu_s),
                                ("RLIMIT_AS", vm_size + extra if vm_size else -1),
                                ("RLIMIT_NPROC", limits.processes if own_uid else -1)):
                if value >= 0:
                    resource.setrlimit(getattr(resource, name), (value, value))
            done["limits"] = {"address_space_bytes": vm_size + extra,
                              "processes": limits.processes if own_uid else None,
                              "cpu_s": limits.cpu_s,
                              "file_bytes": limits.file_bytes}
            if root and facts["mount_namespace"]:
                # Python may live in /root, the folder in a TMPDIR only root may enter
                done["exposed"] = _expose(_python_paths() + [self.folder])
            if root:
                os.chown(self.folder, sandbox_uid, sandbox_uid)
                os.setgroups([])
                os.setresgid(sandbox_uid, sandbox_uid, sandbox_uid)
                os.setresuid(sandbox_uid, sandbox_uid, sandbox_uid)
            elif facts["user_namespace"]:
                _drop_capabilities()  # full in the new user namespace until now
            _libc_call("no_new_privs", "prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            _libc_call("not dumpable", "prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
            _libc_call("pdeathsig", "prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            done.update(uid=os.getuid(), unprivileged_uid=root and os.getuid() == sandbox_uid)
        except Exception as exc:
            _write_all(setup_w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
                       + b"\n")
            raise
        if not (facts["mount_namespace"] and facts["network_namespace"]):
            sys.addaudithook(_guard(self.folder, private_tmp=facts["mount_namespace"],
                                    private_network=facts["network_namespace"]))
            done["audit_hook"] = True
        _write_all(setup_w, json.dumps(done).encode() + b"\n")
        os.close(setup_w)
        self.target()


def _redirect_fds(keep: set[int], output_fd: int) -> None:
    """stdin from /dev/null, stdout and stderr to ``output_fd``, and every other inherited
    descriptor but ``keep`` onto /dev/null (kept open, so no number is reused by accident)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep and fd != devnull:
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
    os.close(devnull)


def _python_paths() -> list[str]:
    """The folders Python imports from (the standard library, site-packages, the package).

    The package's own folder is named apart: an editable install (uv's, pip's) imports it
    through a finder, not a sys.path entry, and a course cloned into /tmp must keep it."""
    import dpcost

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.dirname(os.path.dirname(os.path.abspath(dpcost.__file__)))]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    return sorted({os.path.realpath(p) for p in paths})


def _expose(paths: list[str]) -> list[str]:
    """In the worker's mount namespace, as root: make ``paths`` reachable by another uid.

    A folder on the way that others cannot enter (``/root``, mode 700, where pyenv puts Python)
    is covered by an empty tmpfs, into which only the needed child folders are bind-mounted
    back: the rest of that folder stays hidden. Returns the folders covered.
    """
    covered: list[str] = []
    while True:
        blocked: dict[str, set[str]] = {}  # folder others cannot enter: children needed
        for path in paths:
            parts = path.strip("/").split("/")
            for depth in range(len(parts) - 1):
                folder = "/" + "/".join(parts[:depth + 1])
                try:
                    mode = os.stat(folder).st_mode
                except OSError:
                    break
                if not mode & stat.S_IXOTH:
                    blocked.setdefault(folder, set()).add(parts[depth + 1])
                    break
        if not blocked:
            return covered
        for folder, children in blocked.items():
            kept = {child: os.open(f"{folder}/{child}", os.O_PATH) for child in children
                    if os.path.isdir(f"{folder}/{child}")}
            _libc_call(f"cover {folder}", "mount", b"tmpfs", folder.encode(), b"tmpfs",
                       MS_NOSUID | MS_NODEV, b"mode=755,size=64k")
            covered.append(folder)
            for child, fd in kept.items():
                os.mkdir(f"{folder}/{child}")
                _libc_call(f"expose {folder}/{child}", "mount", f"/proc/self/fd/{fd}".encode(),
                           f"{folder}/{child}".encode(), None, MS_BIND | MS_REC, None)
                os.close(fd)


def _loopback_up() -> None:
    """Bring up ``lo`` of a new network namespace (it starts down): SIOCSIFFLAGS |= IFF_UP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _libc_call("capset", "capset", ctypes.byref(header), (_CapData * 2)())


def _sweep(worker_pid: int, uid: int | None) -> None:
    """Without a PID namespace: kill the worker's session, every descendant of the keeper (the
    subreaper of whatever the sandbox orphaned) and, where the sandbox has a uid of its own,
    every process of that uid (a new session does not escape that); return once none
    is left but zombies (at most 2 s: a process may fork while we look)."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        found = False
        descendants = set(_descendants(os.getpid()))  # the keeper's: it is their subreaper
        for pid in _processes():
            try:
                with open(f"/proc/{pid}/stat", "rb") as stat_file:
                    fields = stat_file.read().rsplit(b")", 1)[1].split()
                owner = os.stat(f"/proc/{pid}").st_uid
            except (OSError, IndexError):
                continue
            # After "(comm)": state, ppid, pgrp, session.
            if fields[0] != b"Z" and (fields[3] == str(worker_pid).encode()
                                      or (uid is not None and owner == uid)
                                      or pid in descendants):
                found = True
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


def _processes() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _read_proc(proc_fd: int, path: str) -> str:
    """The text of ``path`` under the /proc that ``proc_fd`` holds open."""
    fd = os.open(path, os.O_RDONLY, dir_fd=proc_fd)
    try:
        return os.read(fd, 1 << 16).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _descendants(pid: int, proc_fd: int | None = None) -> list[int]:
    """Every living descendant of ``pid``, from each thread's children list, read under the
    /proc that ``proc_fd`` holds (the keeper's, whose pids are its own; default /proc)."""
    own = proc_fd is None
    if own:
        proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    found, todo = [], [pid]
    try:
        while todo:
            parent = todo.pop()
            try:
                fd = os.open(f"{parent}/task", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc_fd)
            except OSError:
                continue
            try:
                threads = os.listdir(fd)
            finally:
                os.close(fd)
            for thread in threads:
                try:
                    kids = [int(kid) for kid in _read_proc(
                        proc_fd, f"{parent}/task/{thread}/children").split()]
                except (OSError, ValueError):
                    continue
                found += kids
                todo += kids
    finally:
        if own:
            os.close(proc_fd)
    return found


# ---- memory: a cgroup's limit, or the keeper's sum -----------------------------------------

def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _own_memory_cgroup() -> str:
    """The folder of this process's memory cgroup (v1's memory hierarchy, else v2's)."""
    with open("/proc/self/cgroup") as f:
        entries = [line.rstrip("\n").split(":", 2) for line in f]
    with open("/proc/self/mountinfo") as f:
        mounts = []
        for line in f:
            fields = line.split()
            after = fields.index("-")
            mounts.append((fields[3], fields[4], fields[after + 1], fields[after + 3]))
    for hierarchy, controllers, path in entries:
        v1 = "memory" in controllers.split(",")
        if not v1 and not (hierarchy == "0" and controllers == ""):
            continue
        for root, mount_point, fs_type, options in mounts:
            if (fs_type == "cgroup" and v1 and "memory" in options.split(",")) or (
                    fs_type == "cgroup2" and not v1):
                relative = os.path.relpath(path, root) if path.startswith(root) else None
                if relative is not None:
                    return os.path.normpath(os.path.join(mount_point, relative))
    raise OSError("no memory cgroup found")


def _make_cgroup(limit_bytes: int) -> tuple[str, str] | None:
    """A memory cgroup below ours limited to ``limit_bytes`` (no swap): (its folder, ours), or
    None where the system does not let us make one (not root, no delegation, no controller).
    In cgroup v1 its processes wait at the limit instead of being killed one by one: the keeper
    sees it and stops them all (v2 kills the whole group at once)."""
    try:
        home = _own_memory_cgroup()
        folder = os.path.join(home, f"dpcost-sandbox-{os.getpid()}")
        os.mkdir(folder)
    except (OSError, ValueError):
        return None
    try:
        if os.path.exists(f"{folder}/memory.limit_in_bytes"):  # v1
            _write_file(f"{folder}/memory.limit_in_bytes", str(limit_bytes))
            for name, value in (("memory.memsw.limit_in_bytes", limit_bytes),
                                ("memory.oom_control", 1)):
                with contextlib.suppress(OSError):
                    _write_file(f"{folder}/{name}", str(value))
        elif os.path.exists(f"{folder}/memory.max"):  # v2, where memory is delegated
            _write_file(f"{folder}/memory.max", str(limit_bytes))
            for name, value in (("memory.swap.max", 0), ("memory.oom.group", 1)):
                with contextlib.suppress(OSError):
                    _write_file(f"{folder}/{name}", str(value))
        else:
            raise OSError("no memory controller in the new cgroup")
        _write_file(f"{folder}/cgroup.procs", "0")  # can we move in and out again?
        _write_file(f"{home}/cgroup.procs", "0")
    except OSError:
        _write_file_quietly(f"{home}/cgroup.procs", "0")
        _remove_cgroup(folder)
        return None
    return folder, home


def _write_file_quietly(path: str, text: str) -> None:
    with contextlib.suppress(OSError):
        _write_file(path, text)


def _remove_cgroup(folder: str) -> None:
    """rmdir the cgroup once its processes are gone (they may take a moment to leave it)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _memory_of(pid: int, root: bool, proc_fd: int) -> int:
    """Bytes of memory ``pid`` holds: its proportional share (PSS) where we may read it (as
    root), else its resident anonymous and shared memory (which counts each page it still
    shares with the kernel fully: too much, never too little)."""
    try:
        if root:
            for line in _read_proc(proc_fd, f"{pid}/smaps_rollup").splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        return sum(int(line.split()[1]) * 1024 for line in _read_proc(
            proc_fd, f"{pid}/status").splitlines() if line.startswith(("RssAnon:", "RssShmem:")))
    except (OSError, ValueError, IndexError):
        return 0  # it has just ended


def _memory_used(root: bool, proc_fd: int) -> int:
    """Bytes the keeper's descendants (the sandbox: the worker and whatever it started, orphans
    included since the keeper is their subreaper) hold together."""
    return sum(_memory_of(pid, root, proc_fd) for pid in _descendants(os.getpid(), proc_fd))


class _MemoryWatch:
    """The keeper's view of the sandbox's memory: has it passed ``limit_bytes`` together?"""

    def __init__(self, cgroup: str | None, limit_bytes: int, root: bool):
        self.cgroup, self.limit, self.root = cgroup, limit_bytes, root
        # The keeper's /proc, held open: the worker mounts its namespace's over /proc
        self.proc_fd = -1 if cgroup else os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        # Made before the fork: what the worker starts with is what the keeper holds now
        self.baseline = 0 if cgroup else _memory_of(os.getpid(), root, self.proc_fd)

    def exceeded(self) -> bool:
        if self.cgroup:
            return self._cgroup_at_limit()
        return _memory_used(self.root, self.proc_fd) - self.baseline > self.limit

    def _cgroup_at_limit(self) -> bool:
        """v1: the processes wait at the limit (under_oom), or one was killed; v2: the group
        was killed (oom_kill) or hit the limit with nothing left to reclaim (oom)."""
        for name in ("memory.oom_control", "memory.events"):
            try:
                with open(f"{self.cgroup}/{name}") as f:
                    counters = dict(line.split() for line in f if len(line.split()) == 2)
            except OSError:
                continue
            return any(int(counters.get(key, 0)) > 0 for key in ("under_oom", "oom_kill", "oom"))
        return False


# ---- files: private /tmp, /var/tmp, /dev/shm and /run, or a sweep afterwards -----------------

def _private_tmp(keep: list[str], size_bytes: int) -> list[str]:
    """In the worker's mount namespace (as root there): an empty tmpfs over each of
    PRIVATE_TMP, into which the ``keep`` folders under it (the sandbox's folder; Python's, for
    a course cloned into /tmp) are bound back. What the sandbox writes there, sockets included,
    is its own and vanishes with the namespace. Returns the folders covered."""
    kept = sorted({os.path.realpath(path) for path in keep if os.path.isdir(path)})
    covered: list[str] = []
    for top in PRIVATE_TMP:
        folder = os.path.realpath(top)
        if folder in covered or not os.path.isdir(folder):
            continue
        inside = [path for path in kept if path.startswith(folder + os.sep)]
        inside = [path for path in inside  # the outermost ones: binding those brings the rest
                  if not any(path.startswith(other + os.sep) for other in inside)]
        held = {path: os.open(path, os.O_PATH) for path in inside}
        try:
            _libc_call(f"cover {folder}", "mount", b"tmpfs", folder.encode(), b"tmpfs",
                       MS_NOSUID | MS_NODEV, f"mode=1777,size={size_bytes}".encode())
            covered.append(folder)
            for path, fd in held.items():
                os.makedirs(path, exist_ok=True)
                _libc_call(f"keep {path}", "mount", f"/proc/self/fd/{fd}".encode(),
                           path.encode(), None, MS_BIND | MS_REC, None)
        finally:
            for fd in held.values():
                os.close(fd)
    return covered


def _listing(folders) -> dict[str, set[str]]:
    found = {}
    for folder in folders:
        with contextlib.suppress(OSError):
            found[folder] = set(os.listdir(folder))
    return found


def _remove_new(before: dict[str, set[str]], uid: int) -> None:
    """Without a mount namespace, once every process of the sandbox is gone: remove what its
    uid (its own) created in the shared /tmp, /var/tmp and /dev/shm, at the top or in a folder
    anyone may write to (the only other places that uid could write)."""
    todo = [(folder, names) for folder, names in before.items()]
    while todo:
        folder, old = todo.pop()
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and name in old:
                todo.append((path, set()))


# ---- the environment, and what an audit hook refuses where a namespace is missing ------------

def _environment_block() -> tuple[int, int]:
    """The addresses of the environment this process was started with, which
    /proc/self/environ shows: fields 50 and 51 of /proc/self/stat (env_start, env_end)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # fields[0] is field 3 (state)
    return int(fields[50 - 3]), int(fields[51 - 3])


def _replace_environment(folder: str) -> None:
    """The worker's environment: the kernel's ENVIRONMENT_KEPT (and LC_*), HOME and TMPDIR in
    its folder, nothing else (a JupyterHub API token, say): not in ``os.environ``, not in
    ``posix.environ``, and not in the block /proc/self/environ reads, which is blanked."""
    import posix

    kept = {key: value for key, value in os.environ.items()
            if key in ENVIRONMENT_KEPT or key.startswith("LC_")}
    kept.update(HOME=folder, TMPDIR=folder, TMP=folder, TEMP=folder)
    os.environ.clear()  # unsetenv each: libc's environ no longer points into the block
    posix.environ.clear()
    os.environ.update(kept)
    start, end = _environment_block()
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _is_loopback(host) -> bool:
    import ipaddress

    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anywhere


def _guard(folder: str, *, private_tmp: bool, private_network: bool):
    """An audit hook (PEP 578) for a worker that lacks a mount or network namespace. It refuses,
    with PermissionError: a Unix socket outside the sandbox's folder (abstract names, which
    multiprocessing uses between the sandbox's own processes, pass); without a network
    namespace, any host but the loopback; without a mount namespace, creating or writing files
    in /tmp, /var/tmp and /dev/shm outside the folder. Python's level only: ctypes, C
    extensions and a new interpreter pass by it, so it is a fallback, never the boundary."""
    home = os.path.realpath(folder) + os.sep
    shared = tuple(os.path.realpath(top) + os.sep for top in SHARED_TMP)
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    creations = {"os.mkdir": 0, "os.mkfifo": 0, "os.mknod": 0, "os.rename": 1, "os.symlink": 1,
                 "os.link": 1}  # event: the argument that names what is made

    def where(path) -> str:
        try:
            return os.path.realpath(os.fsdecode(path)) + os.sep
        except (TypeError, ValueError):
            return ""

    def in_shared_tmp(path) -> bool:
        real = where(path)
        return real.startswith(shared) and not real.startswith(home)

    def hook(event, args):
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            sock, address = args[0], args[1]
            family = getattr(sock, "family", None)
            if family == socket.AF_UNIX and isinstance(address, (str, bytes)) and address and (
                    address[:1] not in ("\0", b"\0")) and not where(address).startswith(home):
                raise PermissionError(f"the sandbox refuses Unix sockets outside its folder: "
                                      f"{address!r}")
            if (family in (socket.AF_INET, socket.AF_INET6) and not private_network
                    and isinstance(address, tuple) and not _is_loopback(address[0])):
                raise PermissionError(f"the sandbox refuses hosts other than the loopback: "
                                      f"{address[0]!r}")
        elif private_tmp:
            return
        elif event == "open" and len(args) == 3 and not isinstance(args[0], int):
            if args[2] & writes and in_shared_tmp(args[0]):
                raise PermissionError(f"the sandbox refuses files outside its folder in "
                                      f"/tmp, /var/tmp and /dev/shm: {args[0]!r}")
        elif event in creations and len(args) > creations[event]:
            target = args[creations[event]]
            if not isinstance(target, int) and in_shared_tmp(target):
                raise PermissionError(f"the sandbox refuses files outside its folder in "
                                      f"/tmp, /var/tmp and /dev/shm: {target!r}")

    return hook


_PROTECTIONS: dict = {}


def protections() -> dict:
    """What confines a sandboxed child on this machine, found by starting one (once, cached):
    {"unprivileged_uid", "pid_namespace", "user_namespace", "mount_namespace": bool,
    "limits": {...}, "uid": the worker's uid}."""
    if not _PROTECTIONS:
        sandbox = Confined(lambda: None, hide_package=True).start()
        try:
            _PROTECTIONS.update(sandbox.protections)
        finally:
            sandbox.stop()
    return dict(_PROTECTIONS)


if sys.platform != "linux":  # pragma: no cover - the course's checkers need Linux's fork
    raise ImportError("dpcost.grading.confine needs Linux")
