"""The tool's own errors and the one table that maps them to exit codes."""
from __future__ import annotations

# Exit codes of gpumemdoctor itself. A target that ran passes its own exit
# status through (128 + N when a signal N killed it), so these only appear when
# gpumemdoctor could not do its job. Keep the table in docs/cli.md in step with this one
# (tests/test_docs.py checks that every code is there).
EXIT_USAGE = 2
EXIT_NO_GPU = 3
EXIT_BAD_REPORT = 4
EXIT_MISSING_EXTRA = 5  # an optional extra is not installed (--html without plotly)
EXIT_CHECK_FAILED = 10  # a CI check failed (and the target itself succeeded)
EXIT_GPU_BUSY = 11  # `ps --expect-free`: a GPU holds more than allowed
EXIT_WATCH_ALERT = 12  # `watch --exit-on-alert`: a limit was crossed
EXIT_NO_DEBUGGER = 13  # `watch --attach` needs gdb (or lldb) here, and there is none
EXIT_ATTACH_REFUSED = 14  # `watch --attach`: not allowed to trace the process (ptrace, another user)
EXIT_NOT_ATTACHABLE = 15  # `watch --attach`: the process cannot take the agent (not Python, no torch, ...)
EXIT_ATTACH_FAILED = 16  # `watch --attach`: the attach was tried, the agent did not start (no safe point in time)
EXIT_INTERNAL = 70


class DoctorError(Exception):
    """An error the user can act on: one line, with what to do."""

    exit_code = EXIT_INTERNAL


class UsageError(DoctorError):
    """Bad arguments, a missing script, an existing output file."""

    exit_code = EXIT_USAGE


class NoGpuError(DoctorError):
    """NVML (the NVIDIA driver's management library) cannot be used here."""

    exit_code = EXIT_NO_GPU


class BadReportError(DoctorError):
    """A report or recording file that is not what it claims to be."""

    exit_code = EXIT_BAD_REPORT


class MissingExtraError(DoctorError):
    """An option needs an optional extra that is not installed."""

    exit_code = EXIT_MISSING_EXTRA


class NoDebuggerError(DoctorError):
    """`watch --attach` to a Python older than 3.14 needs a debugger, and none is installed."""

    exit_code = EXIT_NO_DEBUGGER


class AttachRefusedError(DoctorError):
    """The process may not be traced from here: ptrace's settings, another user's process."""

    exit_code = EXIT_ATTACH_REFUSED


class NotAttachableError(DoctorError):
    """The process cannot take the agent: not Python, too old, no gpumemdoctor or torch in it, an agent already."""

    exit_code = EXIT_NOT_ATTACHABLE


class AttachFailedError(DoctorError):
    """The attach was tried and did not bring the agent in: the program stayed as it was."""

    exit_code = EXIT_ATTACH_FAILED


def internal_error(exc: BaseException) -> str:
    """The one line for a bug of gpumemdoctor's own (exit 70, or the target's status after it ran)."""
    return f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"
