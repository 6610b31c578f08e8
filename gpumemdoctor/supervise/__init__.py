"""The supervisor of `gpumemdoctor run` (layer 5): `supervisor` starts the target with the agent on its
path, polls NVML for its process tree, and builds the recording; `signals` passes the signals sent to
it on to the target, each once; `recovery` rebuilds the recording of a run whose supervisor was killed,
from the run folder it left.
"""
