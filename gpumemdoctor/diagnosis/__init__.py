"""From a recording to a verdict (layer 7). Pure: no NVML, no torch, no files (app/ reads and writes them).

`diagnose` is the entry (`diagnose`, `diagnose_job`); `breakdown` splits a process's memory at exit
into its parts, and `streams` tells freed blocks held for unfinished stream work from finished
work's (cache); `retention` turns the growth of the live tensors into the evidence of a leak, and
`holders` attaches the suspects a finding names; `findings` holds the data classes and the
verdict list; `judgement` is the one decision table over the evidence (`evidence`) about one process
on one GPU (its out-of-memory row in `out_of_memory`, what memory held to the end also says in `held`),
and `remedies` the one table of what to do. Every sentence a finding acts on is a claim with its
evidence (`claims`), made only where that evidence was seen, and `words` turns claims into words
(the one words API the reporters import); `summaries` makes the findings' summaries from the facts
the rows found (the rows decide, they do not word), `summaries_peak` the peak's and the probes' words,
`summaries_allocated` the words of the findings at PyTorch's allocated peak and of the peaks that could
be lower, `summaries_ranks` the ranks', `summaries_suspects` the suspects', `summaries_ci` the CI
checks' and `summaries_run` the words of how a process ran and ended (its step gaps, its end, NCCL,
other GPU libraries, what NVML alone saw, its children), all in `summaries_registry`'s one registry;
`limits` is the limit in force (the device, or a per-process memory fraction) that every "would fit"
and headroom figure is held to. The evidence comes from `suspects` (the
agent's searches as holders), `accumulations` (many alike tensors in a search: a leak not watched
growing), `probed` (holders named by the peak's probes where no copy was searched), `phases` (pauses
in the steps), `stacks` (a group's device, a holder's line), `non_torch`, `nccl` and
`libraries` (memory outside PyTorch and whose it is), `ends` (an end not seen), `step_gaps` (the longest gap between two step ends, where it stands out), `machine_faults`
(host memory, NVML failures), `ranks` and `job` (distributed jobs), and `child_processes` (orphans,
children's contexts). `peak` says what made each process's peak (`peak_warnings`: the peaks that
could be lower; `allocated_peak`: at
PyTorch's allocated peak, from the allocator's events; `cache_filled`: what filled a peak's cache), `fit` what would have made an
out-of-memory error fit, and `headroom` how long a growth had left before its GPU was full. `ci_checks` turns a diagnosis into the CI gate's pass or fail.
"""
