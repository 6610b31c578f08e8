"""The operating system and the driver, seen from outside the target (layer 3).

`nvml` is the only module that calls NVML; `procs` the only one that uses psutil; `agent_socket` is
both ends of the agent's local read-only socket (the agent serves it, `gpumemdoctor watch` queries
it); `inject` runs a few lines of Python inside another running CPython (sys.remote_exec, ptrace, gdb
or lldb), for `watch --attach`; `ptrace` queues them through ptrace alone (x86-64 Linux). Each turns "not supported", "gone" and "not ours" into a plain
not-available value, or into one error with the fix.
"""
