"""The operating system and the driver, seen from outside the target (layer 2).

`nvml` is the only module that calls NVML; `procs` the only one that uses psutil; `agent_socket` is
both ends of the agent's local read-only socket (the agent serves it, `gpumemdoctor watch` queries
it). Each turns "not supported", "gone" and "not ours" into a plain not-available value.
"""
