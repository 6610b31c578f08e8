"""The holder search: which Python object holds each live allocator block, found without running
any of the program's code (ARCHITECTURE.md, "The holder search").

`search` is the search itself (`investigate`: its phases, the groups, why a block has no holder).
It stands on `blocks` (the allocator's live blocks, which objects are tensors), `anchors` (the one
pass over the heap for what lies in a block), `roots` (where paths start), `heap` (`Sweep`, `Climb`,
`Budget`: the garbage collector's own traversals), `graphs` (blocks that autograd graphs save) and
`edges` (a path's labels, read without the program's code). `first_sweep` is the exit search's
first move, `forked` runs a search in an `os.fork` copy of the process, `referents` labels the
references the garbage look-up (`garbage` beside this package) names a cycle's links with, and
`loop_holder` names who holds a library loop's gathered result at a history reading.
"""
