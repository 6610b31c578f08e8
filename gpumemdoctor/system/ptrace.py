"""Queue a few lines of Python in another running CPython through ptrace alone (x86-64 Linux), for
`watch --attach` where no `sys.remote_exec` is (Python older than 3.14) and no debugger is asked for.

No debugger is needed, and none of a debugger's inferior calls: gdb 13 has been seen to fail them on
kernel 6.18 with CPUs that have AMX ("Couldn't write extended state status: Bad address"), and leave
the target with a system call's restart code as its result (`OSError: [Errno 514]`). Here the target's
main thread is stopped (PTRACE_SEIZE, then PTRACE_INTERRUPT), its registers and its whole extended
state (x87, SSE, AVX, AVX-512, AMX: PTRACE_GETREGSET NT_X86_XSTATE) are read, and two functions are
called in it, each from a stack frame below the red zone with the address 0 to return to (the return
stops it with SIGSEGV at 0, where its result is read):

1. libc's `mmap`, for one page of the target's own, where the lines are written (through
   /proc/PID/mem, as the tracer may);
2. the interpreter's `Py_AddPendingCall(PyRun_SimpleString, page)`, which only queues the call: it
   allocates nothing, and is made to be called from any thread at any time.

Then every register is put back as it was read (the instruction pointer, a system call's number
and its restart state included), the signal that the stop held, if any, is delivered, and the
process is let go. The interpreter runs the queued call on its main thread between two bytecodes,
holding the GIL, never inside an allocation. The lines must catch everything (a pending call that
fails raises in the program) and unmap their page (`unmap_lines`). Where the main thread runs no
Python (blocked in C), the call stays queued until it does; the caller's lines say what they do then.

Symbols are read from the mapped files' dynamic symbol tables (ELF64, parsed strictly: every offset
and size checked against the file).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import signal
import struct
import time
from dataclasses import dataclass

PTRACE_CONT = 7
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_GETSIGINFO = 0x4202
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
NT_PRFPREG = 2
NT_X86_XSTATE = 0x202
XSTATE_MAX = 1 << 16  # bytes: more than any x86 CPU's XSAVE area (AMX's is about 11 KiB)
WALL = 0x40000000  # __WALL
STACK_BELOW = 4096  # bytes left untouched below the stopped thread's stack pointer (the red zone is 128)
CALL_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 5.0
PAGE = 4096
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
SEGV_CPERR = 10  # a control-protection fault: the return on a shadow stack that did not see the call
# user_regs_struct's fields, in order (x86-64)
REGS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
        "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")
ARGUMENTS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")


class PtraceError(Exception):
    """What went wrong, in words, with the errno where one was (EPERM: refused; ESRCH: gone)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in REGS]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


# -- symbols --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mapped:
    path: str
    start: int  # the lowest address a mapping of the file starts at
    offset: int  # that mapping's offset in the file


def mapped_files(pid: int) -> list[Mapped]:
    """Each file mapped in the process, with its lowest mapping (the one the load bias is read from)."""
    seen: dict[str, Mapped] = {}
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            path = parts[5].rstrip("\n")
            start = int(parts[0].split("-")[0], 16)
            if path not in seen or start < seen[path].start:
                seen[path] = Mapped(path, start, int(parts[2], 16))
    return list(seen.values())


def dynamic_symbols(data: bytes, names: set[str]) -> tuple[dict[str, int], int, int]:
    """(the named functions' addresses in the file, the ELF type, the vaddr of the first PT_LOAD at file
    offset 0) from an ELF64 little-endian file's .dynsym. Raises ValueError on anything malformed."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    e_type, = struct.unpack_from("<H", data, 16)
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)

    def table(off: int, size: int, count: int) -> range:
        if size < 56 and count or off + size * count > len(data):
            raise ValueError("a header table lies outside the file")
        return range(off, off + size * count, size)

    base_vaddr = None
    for at in table(phoff, phentsize, phnum):
        p_type, _, p_offset, p_vaddr = struct.unpack_from("<IIQQ", data, at)
        if p_type == 1 and p_offset == 0 and base_vaddr is None:  # PT_LOAD
            base_vaddr = p_vaddr
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, at) for at in table(shoff, shentsize, shnum)]
    found: dict[str, int] = {}
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 11 or not entsize:  # SHT_DYNSYM
            continue
        if link >= len(sections) or offset + size > len(data):
            raise ValueError("the dynamic symbol table lies outside the file")
        str_off, str_size = sections[link][4], sections[link][5]
        if str_off + str_size > len(data):
            raise ValueError("the dynamic string table lies outside the file")
        for at in range(offset, offset + size - 23, entsize):
            st_name, st_info, _, st_shndx, st_value = struct.unpack_from("<IBBHQ", data, at)
            if not st_value or st_shndx == 0 or (st_info & 0xF) != 2 or st_name >= str_size:
                continue  # not a defined function (STT_FUNC)
            end = data.find(b"\0", str_off + st_name, str_off + str_size)
            name = data[str_off + st_name:end if end >= 0 else str_off + str_size].decode("ascii", "replace")
            if name in names:
                found.setdefault(name, st_value)
    return found, e_type, base_vaddr or 0


def resolve(pid: int, wanted: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """The run-time address of each wanted function: {name: (file name parts to look in, in order)}.
    A name not found is left out."""
    files = mapped_files(pid)
    out: dict[str, int] = {}
    cache: dict[str, tuple[dict[str, int], int, int]] = {}
    names = set(wanted)
    for name, where in wanted.items():
        for part in where:
            for m in files:
                if part not in os.path.basename(m.path):
                    continue
                if m.path not in cache:
                    cache[m.path] = _symbols_of(pid, m.path, names)
                symbols, e_type, base_vaddr = cache[m.path]
                if name in symbols:
                    bias = m.start - m.offset - base_vaddr if e_type == 3 else 0  # ET_DYN: where it was loaded
                    out[name] = bias + symbols[name]
                    break
            if name in out:
                break
    return out


def _symbols_of(pid: int, path: str, names: set[str]) -> tuple[dict[str, int], int, int]:
    for candidate in (f"/proc/{pid}/root{path}", path):  # the file as the process sees it (a container)
        try:
            with open(candidate, "rb") as f:
                data = f.read()
        except OSError:
            continue
        try:
            return dynamic_symbols(data, names)
        except (ValueError, struct.error):
            return {}, 0, 0
    return {}, 0, 0


# -- ptrace ---------------------------------------------------------------------------------

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.ptrace.restype = ctypes.c_long
        _libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    return _libc


def _ptrace(request: int, pid: int, addr=None, data=None, what: str = "ptrace") -> int:
    ctypes.set_errno(0)
    rc = _c().ptrace(request, pid, addr, data)
    err = ctypes.get_errno()
    if rc == -1 and err:
        raise PtraceError(f"{what}: {os.strerror(err)}", err)
    return rc


class Tracee:
    """The target's main thread, seized and stopped, its state read; `close` puts it back and lets go."""

    def __init__(self, pid: int):
        self.pid = pid
        self.pending_signal = 0  # a signal the stops took, delivered again when the process is let go
        self.saved: Regs | None = None
        self.xstate: bytes | None = None
        self.seized = False

    def seize(self) -> None:
        _ptrace(PTRACE_SEIZE, self.pid, None, None, what=f"PTRACE_SEIZE of process {self.pid}")
        self.seized = True
        _ptrace(PTRACE_INTERRUPT, self.pid, what="PTRACE_INTERRUPT")
        self._keep_signal(self._wait(STOP_TIMEOUT_S, "stop"))
        self.saved = self.regs()
        self.xstate = self._read_xstate()

    def _keep_signal(self, sig: int) -> None:
        if sig and sig not in (signal.SIGTRAP, signal.SIGSTOP):
            self.pending_signal = sig

    def _wait(self, timeout_s: float, what: str) -> int:
        """The next stop's signal (0 for a ptrace event stop, as PTRACE_INTERRUPT's)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got, status = os.waitpid(self.pid, os.WNOHANG | WALL)
            if got == self.pid:
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    self.seized = False
                    raise PtraceError(f"process {self.pid} ended while it was stopped", errno.ESRCH)
                if os.WIFSTOPPED(status):
                    event = status >> 16
                    return 0 if event == PTRACE_EVENT_STOP else os.WSTOPSIG(status)
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.0005)

    def regs(self) -> Regs:
        r = Regs()
        _ptrace(PTRACE_GETREGS, self.pid, None, ctypes.byref(r), what="PTRACE_GETREGS")
        return r

    def set_regs(self, r: Regs) -> None:
        _ptrace(PTRACE_SETREGS, self.pid, None, ctypes.byref(r), what="PTRACE_SETREGS")

    def _read_xstate(self) -> bytes | None:
        buf = ctypes.create_string_buffer(XSTATE_MAX)
        iov = IoVec(ctypes.cast(buf, ctypes.c_void_p), XSTATE_MAX)
        try:
            _ptrace(PTRACE_GETREGSET, self.pid, NT_X86_XSTATE, ctypes.byref(iov), what="PTRACE_GETREGSET")
        except PtraceError:
            return None
        return buf.raw[:iov.len]

    def _write_xstate(self) -> None:
        """The extended state put back; where the kernel refuses the whole of it, its first 512 bytes
        (the FXSAVE area: x87, SSE, MXCSR), which is what the two calls could have changed."""
        if self.xstate is None:
            return
        for kind, data in ((NT_X86_XSTATE, self.xstate), (NT_PRFPREG, self.xstate[:512])):
            buf = ctypes.create_string_buffer(data, len(data))
            iov = IoVec(ctypes.cast(buf, ctypes.c_void_p), len(data))
            try:
                _ptrace(PTRACE_SETREGSET, self.pid, kind, ctypes.byref(iov), what="PTRACE_SETREGSET")
                return
            except PtraceError:
                if kind == NT_PRFPREG:
                    raise

    def write(self, address: int, data: bytes) -> None:
        fd = os.open(f"/proc/{self.pid}/mem", os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if os.pwrite(fd, data, address) != len(data):
                raise PtraceError("a short write into the process's memory")
        finally:
            os.close(fd)

    def call(self, function: int, *args: int) -> int:
        """function(*args) on the stopped thread; its return value (rax). The thread's own registers are
        back in place after it (close() puts back its extended state)."""
        assert self.saved is not None
        r = Regs.from_buffer_copy(self.saved)
        sp = ((self.saved.rsp - STACK_BELOW) & ~0xF) - 8  # at a function's entry, rsp + 8 is 16-aligned
        self.write(sp, b"\0" * 8)  # the return address: 0
        r.rsp, r.rip, r.rax, r.orig_rax = sp, function, 0, (1 << 64) - 1  # orig_rax -1: no syscall restart
        for name, value in zip(ARGUMENTS, args):
            setattr(r, name, value & ((1 << 64) - 1))
        self.set_regs(r)
        _ptrace(PTRACE_CONT, self.pid, None, None, what="PTRACE_CONT")
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            try:
                sig = self._wait(max(0.0, deadline - time.monotonic()), "call")
            except TimeoutError:
                _ptrace(PTRACE_INTERRUPT, self.pid, what="PTRACE_INTERRUPT")
                self._wait(STOP_TIMEOUT_S, "stop")
                self.set_regs(self.saved)
                raise PtraceError(f"a call in process {self.pid} did not return within {CALL_TIMEOUT_S:.0f} s") from None
            if sig == signal.SIGSEGV:
                now = self.regs()
                if now.rip == 0 or _si_code(self.pid) == SEGV_CPERR:
                    self.set_regs(self.saved)
                    return now.rax
                self.set_regs(self.saved)
                raise PtraceError(f"a call in process {self.pid} faulted at {now.rip:#x}")
            self._keep_signal(sig)  # another signal came meanwhile: kept for the end, not delivered now
            _ptrace(PTRACE_CONT, self.pid, None, None, what="PTRACE_CONT")

    def close(self) -> None:
        """Every register put back as it was read, then the process let go with the signal it was due."""
        if not self.seized:
            return
        try:
            if self.saved is not None:
                self.set_regs(self.saved)
                self._write_xstate()
        finally:
            self.seized = False
            _ptrace(PTRACE_DETACH, self.pid, None, self.pending_signal or None, what="PTRACE_DETACH")


def _si_code(pid: int) -> int | None:
    info = ctypes.create_string_buffer(128)
    try:
        _ptrace(PTRACE_GETSIGINFO, pid, None, info, what="PTRACE_GETSIGINFO")
    except PtraceError:
        return None
    return struct.unpack_from("<iii", info.raw, 0)[2]


# -- the pending call ----------------------------------------------------------------------

WANTED = {"Py_AddPendingCall": ("libpython", "python"), "PyRun_SimpleString": ("libpython", "python"),
          "mmap": ("libc.so", "libc-"), "munmap": ("libc.so", "libc-")}


def page_size(code: bytes) -> int:
    return (len(code) + 1 + PAGE - 1) // PAGE * PAGE


def unmap_lines(address: int, size: int) -> str:
    """Lines that give the page back, for the end of the queued code: through ctypes only where the
    program has imported it already (torch does), so that nothing new is imported into it."""
    return "\n".join([
        "import sys",
        "if 'ctypes' in sys.modules:",
        "    _c = sys.modules['ctypes']",
        "    _m = _c.CDLL(None).munmap",
        "    _m.argtypes = (_c.c_void_p, _c.c_size_t)",
        f"    _m({address}, {size})",
    ])


def guarded(statement: str) -> str:
    """The lines as the pending call runs them: whatever they raise is caught, even a NameError of
    `exec` itself in an interpreter that is shutting down (a bare `except:` looks up no name), so the
    call returns 0. A pending call that returns -1 raises SystemError in the program (seen on the CPU:
    one queued as the program ended)."""
    return "try:\n" + "\n".join("    " + line for line in statement.splitlines()) + "\nexcept:\n    pass\n"


def queue(pid: int, make_code) -> dict:
    """Queue the lines `make_code(page address, page size)` returns (one Python statement, ASCII) as a
    pending call in process `pid`. Returns {"seconds": how long the process was stopped, "page": its
    address}. Raises PtraceError (its `code`: EPERM refused, ESRCH gone) or LookupError (a symbol
    missing: not a CPython, or one that hides its symbols)."""
    addresses = resolve(pid, WANTED)
    missing = [name for name in WANTED if name not in addresses]
    if missing:
        raise LookupError(", ".join(missing))
    tracee = Tracee(pid)
    started = time.monotonic()
    try:
        tracee.seize()
        probe = guarded(make_code(0, PAGE))
        size = page_size(probe.encode("ascii")) + PAGE  # room for the address's digits
        page = tracee.call(addresses["mmap"], 0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           (1 << 64) - 1, 0)
        if page >= (1 << 64) - 4096 or page == 0:
            raise PtraceError(f"mmap in process {pid} failed ({os.strerror((1 << 64) - page)})")
        code = guarded(make_code(page, size)).encode("ascii") + b"\0"
        if len(code) > size:
            tracee.call(addresses["munmap"], page, size)
            raise PtraceError("the lines do not fit their page")
        tracee.write(page, code)
        queued = tracee.call(addresses["Py_AddPendingCall"], addresses["PyRun_SimpleString"], page) & 0xFFFFFFFF
        if queued != 0:
            tracee.call(addresses["munmap"], page, size)
            raise PtraceError(f"the Python of process {pid} refused the pending call (its queue is full): try again")
    finally:
        stopped_s = time.monotonic() - started
        tracee.close()
    return {"seconds": round(stopped_s, 4), "page": page}
