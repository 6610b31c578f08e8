"""Processes already running, seen from outside (layer 7, beside `diagnosis`): what `ps` and `watch`
use. `ps` surveys the GPUs' processes and says what nobody accounts for; `watch` samples one process
tree and judges its floor; `roles` tells a job's launcher, ranks and workers apart; `stray` finds a
running job's stray contexts, for both; `attach` brings gpumemdoctor's agent into a running Python
program for `watch --attach`, and takes it out again.
"""
