"""What made the process's peaks: each new high of its memory, and the allocated peak wherever it
falls, between two samples too.

`peak` reads each new high (the allocator's figures, the stepped optimizers' parts, the probe of
the program's names). `history` keeps PyTorch's allocation events from CUDA's start and the marks
of each backward() and optimizer step; `reading` is one reading of them, and `replay` the pure walk
back to the allocated peak (what was live then). `saved_by` records one step with module hooks:
which module's forward saved each activation. `phase_watch` searches at the height of a pause in
the steps that rises above the steps (an evaluation). `plugin_history` is the pytest plugin's: the
same events during one vram_limit test.
"""
