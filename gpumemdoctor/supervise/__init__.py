"""The supervisor of `gpumemdoctor run` (layer 6): `supervisor` starts the target with the agent on its
path, then sets up `tree` while the target starts: the watch of its process tree (NVML, host memory)
and the recording made when it ends; `signals` passes the signals sent to it on to the target, each
once; `recovery` rebuilds the recording of a run whose supervisor was killed, from the run folder it
left.
"""
