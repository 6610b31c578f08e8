"""What the agent reads of the process besides its peaks and its holders: the samples, and the
records made at moments of the run or at its exit.

`sampler` takes the samples (PyTorch's allocator and NVML, read into rows made once) and runs the
sampling thread; `felt` keeps the longest gap between two step ends as the program felt it;
`trace` turns PyTorch's allocation stacks on and off (`--trace`); `events` records collections
that freed CUDA memory, where CUDA started and the fatal exception; `oom` observes out-of-memory
errors, and `step_inputs` what each step was given; `process_groups` watches torch.distributed's
process groups (NCCL); `libraries` other GPU libraries; `served` what the local socket answers
`gpumemdoctor watch`. At exit, `streams` tells apart blocks held for stream work and `parts`
measures what PyTorch's totals do not name (cuBLAS workspaces, CUDA graphs' pools, NCCL, CUDA's
module loading).
"""
