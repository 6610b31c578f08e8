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


def internal_error(exc: BaseException) -> str:
    """The one line for a bug of gpumemdoctor's own (exit 70, or the target's status after it ran)."""
    return f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"
