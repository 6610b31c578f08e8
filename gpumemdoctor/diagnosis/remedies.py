"""Remedies in the user's words, every one of them: a row per holder kind and situation, one per
finding that no holder explains (`FINDINGS`), one per cause of an out-of-memory error
(`OUT_OF_MEMORY`), what the memory outside PyTorch's remedy gains with more evidence
(`NON_TORCH_MORE`), each other GPU library's switch (`LIBRARY_SWITCHES`) and an ended thread's
(`THREAD`). The diagnosis imports them from here; none is written elsewhere. Pure.

Each remedy is two sentences: what keeps the memory, and what to change, in PyTorch's own idiom.
The situation says what the memory did:

- `leak`: it grew with the run and is held (the default);
- `released`: a local that held every step's tensors until its function returned;
- `phase`: it was gathered during a pause in the steps (an evaluation) and let go of at its end:
  not a leak, the peak (judgement row 13);
- `live`: still referenced at exit, nothing grew.

A row for (kind, situation) wins over (kind, "*"); a holder path that matches a PATTERNS row (a
model copied every step) wins over both. Placeholders: {path} the holder's path, {owner} the
object the path starts from (`__main__.val_total` of `__main__.val_total.grad_fn ...`), {name}
its container pattern, {attr} the attribute's name, {fn} the cached function, {at} where it was
allocated (" (allocated at f.py:12)", or nothing).
"""
from __future__ import annotations

import re

# (holder kind, situation): (what keeps the memory, what to change)
REMEDIES: dict[tuple[str, str], tuple[str, str]] = {
    ("global", "leak"): (
        "{name} keeps every one of them{at}.",
        "Store a number (loss.item()) or a CPU copy (x.detach().cpu()), or bound the container "
        "(collections.deque(maxlen=...))."),
    ("attribute", "leak"): (
        "The attribute {attr} of {owner} keeps them{at}.",
        "Keep numbers (.item()) or CPU copies (.detach().cpu()) there, and clear or replace it when the "
        "epoch that needs it ends."),
    ("frame-local", "leak"): (
        "A local variable of a function that is still running keeps them: {path}{at}.",
        "del it or let the function return, and keep numbers or CPU copies in it."),
    ("frame-local", "released"): (
        "A local variable kept every step's tensors while the loop ran: {path}{at}; it let go of them "
        "only when its function returned.",
        "Keep a number (.item()) or a CPU copy (.detach().cpu()) instead, or bound it: a longer loop runs "
        "out of memory."),
    ("autograd-graph", "*"): (
        "{owner} holds an autograd graph{at}: it was summed from tensors that require grad (total_loss "
        "+= loss), and its grad_fn chain keeps every step's saved tensors.",
        "Accumulate loss.item() or loss.detach() instead."),
    ("autograd-graph", "phase"): (
        "{owner} keeps every batch's autograd graph until the evaluation returns{at}: model.eval() does "
        "not stop autograd, and a sum without .item() keeps each graph through its grad_fn chain.",
        "Evaluate under torch.no_grad() (or torch.inference_mode()), and add loss.item() to the total."),
    ("global", "phase"): (
        "{name} gathers every batch's tensors on the GPU until the evaluation ends{at}; then they are let "
        "go of.",
        "Gather CPU copies (.cpu()) or numbers, or reduce as you go (a running metric), to lower the peak."),
    ("attribute", "phase"): (
        "The attribute {attr} of {owner} gathers every batch's tensors on the GPU until the evaluation "
        "ends{at}, as Lightning's validation_step_outputs does.",
        "Gather CPU copies (.cpu()) or numbers, or reduce as you go (a running metric), to lower the peak."),
    ("frame-local", "phase"): (
        "{path} gathers every batch's tensors on the GPU until its function returns{at}.",
        "Gather CPU copies (.cpu()) or numbers, or reduce as you go (a running metric), to lower the peak."),
    ("kept-exception", "*"): (
        "A stored exception keeps its traceback, and the traceback keeps every local of the failing "
        "frames: {path}{at}.",
        "Store str(exc), or call traceback.clear_frames(exc.__traceback__) before keeping it."),
    ("hook", "*"): (
        "A hook's closure keeps them: {path}{at}.",
        "Remove the hook (handle.remove()) when done, or keep bounded .detach().cpu() copies."),
    ("closure", "*"): (
        "A closure keeps them: {path}{at}.",
        "Do not capture tensors in long-lived functions; pass them as arguments."),
    ("cycle", "*"): (
        "{path} is part of a reference cycle{at}, which only the garbage collector frees.",
        "Break it (a weakref for back-references) or call gc.collect() after dropping it."),
    ("generator", "*"): (
        "A suspended generator keeps its local variables until it runs to its end or is closed: "
        "{path}{at}.",
        "Exhaust it, call its .close(), or drop it when done."),
    ("cache", "*"): (
        "{fn} is memoised with functools.lru_cache, which keeps every result it returned, one per distinct "
        "argument{at}.",
        "Bound it (maxsize=...), call {short}.cache_clear() when done, or cache a CPU copy or a number "
        "instead."),
    ("foreign", "*"): (
        "An object of another library holds the memory: {path}{at}. An array made from a tensor "
        "(cupy.asarray, from_dlpack, __cuda_array_interface__) shares its memory and keeps it alive as "
        "long as the array lives.",
        "Drop the array, or copy what you need."),
    ("*", "phase-one"): (
        "{path} holds one tensor of the pause's memory{at}, let go of when the pause ended.",
        "Drop it (del, or set it to None) as soon as it has been used, or keep it on the CPU where the "
        "GPU does not need it, to lower the peak."),
    ("*", "live"): (
        "{path} still references it{at}.",
        "If the program no longer needs it, drop that reference (del it or set it to None; an optimizer "
        "holds its model's parameters too), then torch.cuda.empty_cache() gives the memory back to the "
        "device."),
}

# Holder paths that say more than their kind: (regular expression, situation or "*", the two sentences).
PATTERNS: list[tuple[str, str, tuple[str, str]]] = [
    (r"(?<!_modules)\[\*\]\.(_modules|_parameters|_buffers)\[", "*", (
        "{name} keeps a whole copy of a model's weights each time{at}: a deep copy per step keeps every "
        "copy.",
        "Keep one copy and update it in place (an exponential average: "
        "ema.mul_(d).add_(p.detach(), alpha=1 - d), or torch.optim.swa_utils.AveragedModel), or save "
        "copies to disk (state_dict on the CPU).")),
]

# Blocks without a holder, by why the search found none (search.WHY).
UNHELD: dict[str, str] = {
    "not-reached": "The search stopped before it reached these blocks (the report says why and how far it "
                   "got){at}. Run again with --trace on for their allocating line.",
    "unreachable": "The object that holds them is referred to by nothing the program's modules or live frames "
                   "reach: a reference cycle that gc.collect() frees (the garbage finding says so at exit), or "
                   "a reference from C/C++ code (an extension, a CUDA graph, a C++ hook){at}.",
    "create-graph": "No object the program reaches holds them, and the .grad of {grads} carries an autograd "
                    "graph: backward(create_graph=True) on a leaf makes a reference cycle leaf -> .grad -> its "
                    "graph -> leaf that Python's gc cannot see (PyTorch warns about it). Use "
                    "torch.autograd.grad(..., create_graph=True) instead, or set the leaf's .grad to None when "
                    "done{at}.",
    "no-python-object": "No Python object holds them: C/C++ code does, and the search cannot tell which "
                        "(PyTorch's own buffers such as a cuBLAS workspace per stream, 32 MiB on an H100; an "
                        "extension; a custom autograd Function's C++ state){at}. With --trace on, their "
                        "allocating line shows where they came from.",
    "cublas-workspace": "These are PyTorch's cuBLAS workspaces, one per stream and thread that ran a matrix "
                        "product (32 MiB each on an H100 or H200, and a 1 MiB cuBLASLt one): no tensor holds "
                        "them, and clearing the workspaces at exit gave back exactly their bytes. They are not "
                        "the program's; torch._C._cuda_clearCublasWorkspaces() frees them, and the next matrix "
                        "product makes them again{at}.",
    "live": "No Python object holds it. PyTorch keeps some memory of its own among the allocated blocks: a "
            "cuBLAS workspace per stream and thread that ran a matmul (32 MiB each on an H100 or H200; "
            "torch._C._cuda_clearCublasWorkspaces() frees them). Otherwise C/C++ code holds it{at}.",
}
ENDED_THREAD = " The thread that allocated them has ended; the reference above is what keeps them."
# A thread that raised memory while it ran, and ended (suspects.thread_suspects): no holder to name.
THREAD = ("Free what the thread allocates before it ends, or hand it to an owner that will: a thread's "
          "allocations outlive it.")

# Findings whose remedy no holder gives: by finding kind, or by what decided it. {pid}, {label} and
# {switch} are the finding's own process, library and its switch (LIBRARY_SWITCHES), filled in where
# the finding is made.
FINDINGS: dict[str, str] = {
    "leak-unsearched": "Find what keeps each step's tensors alive: a list that is appended to, a loss accumulated "
                       "without .item() (it keeps the autograd graph), stored outputs; keep Python numbers with "
                       ".item() or .detach(), and del what you no longer need.",
    "live-at-exit-unsearched": "Nothing to do if the program still needs it; otherwise del the references to it "
                               "and call torch.cuda.empty_cache() to give the memory back to the device.",
    "phase-unsearched": "What held it is not known (no search at its height): what a pause gathers lives until it "
                        "ends. Keep numbers (loss.item()) or CPU copies (.detach().cpu()) of what it gathers, or "
                        "reduce as you go (a running metric); run gpumemdoctor with --max-pause 0.1 or more to let "
                        "a search name the holder.",
    "garbage-cycle": "Break the cycle (weakref for back-references, clear the container, avoid keeping "
                     "exceptions or frames, no lambdas or bound methods of an object stored on itself), or call "
                     "gc.collect() after freeing large structures.",
    "collector-disabled": "Automatic garbage collection is off (gc.disable(), or gc.set_threshold(0)), so "
                          "reference cycles are never freed while the program runs. Turn it back on "
                          "(gc.enable()), or call gc.collect() at regular points (each epoch, every N steps) "
                          "while it is off; or break the cycles (weakref for back-references).",
    "end-not-seen": "Let the program end normally (return from main, sys.exit) so that the exit probes run; "
                    "os._exit() skips them. Or run it again with --trace on for allocation stacks.",
    "no-reading": "Let the program end normally (return from main, sys.exit) so that the exit probes run; "
                  "os._exit() right after allocating leaves nothing to read.",
    "context": "Nothing to do; each process that uses a GPU pays this once per device.",
    "pending-stream": "Synchronize the side stream (stream.synchronize() or torch.cuda.synchronize()) before "
                      "expecting the memory back, or avoid record_stream on large tensors.",
    "allocator-cache": "torch.cuda.empty_cache() returns it to the device (other processes can then use it); "
                       "within one process PyTorch reuses it anyway.",
    "non-torch": "Memory allocated outside PyTorch (CuPy, raw cudaMalloc, NCCL, other libraries) must be freed by "
                 "whoever allocated it: cudaFree for raw allocations, the library's own cleanup. gpumemdoctor "
                 "sees such memory only as a total; stacks of individual allocations need CUDA-level tools "
                 "(Nsight Systems with --cudabacktrace, compute-sanitizer --leak-check full).",
    "fragmented-peak": "The allocator's segments were split into free pieces too small for the requests that "
                       "came: start the program with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which lets "
                       "segments grow instead of splitting; allocating the largest tensors first, or the same "
                       "shapes every step (pad varying batches), also helps.",
    "temporary-peak": "A function held a large tensor of its own at the peak: free it as soon as it is used "
                      "(del, or reassign), compute in place (x.mul_(), out=), process it in chunks, or avoid the "
                      "copy (torch.cat of growing lists, .contiguous(), .float() of a half-precision tensor each "
                      "make a whole new tensor).",
    "gathered-at-peak": "Tensors gathered with no backward() after them and let go of together made the peak: "
                        "keep numbers (.item()) or CPU copies (.detach().cpu()) of what you gather, reduce as you go "
                        "(a running metric), or let go of each as soon as it is used.",
    "concatenation-at-peak": "A concatenation's result was made while all its pieces were still held: write the "
                             "pieces into one tensor made beforehand (torch.empty, then out[i:j] = piece, or "
                             "torch.cat(..., out=)), or drop each piece as soon as it is copied.",
    "state-at-evaluation": "Gradients are not needed while evaluating: call optimizer.zero_grad(set_to_none=True) "
                           "before the evaluation. If the optimizer's state must make room too, evaluate in a "
                           "smaller batch, or move the state to the CPU around the evaluation.",
    "graphs-at-peak": "model.eval() does not stop autograd: evaluate under torch.no_grad() (or "
                      "torch.inference_mode()), and keep numbers (loss.item()) or detached CPU copies of what "
                      "you gather, so that no batch's graph outlives the batch.",
    "non-torch-unseen": "Free device memory where it was allocated (cudaFree, the library's own cleanup); CuPy: "
                        "cupy.get_default_memory_pool().free_all_blocks().",
    "host-memory": "Confirm it in the kernel's log (dmesg or journalctl -k: 'Out of memory: Killed process "
                   "<pid>'). Host memory that keeps rising is held on the CPU side: outputs or losses kept in a "
                   "list after .cpu() or .item()-less sums, a cache that is never cleared, DataLoader workers that "
                   "each copy the dataset (fewer workers, or data in shared memory). Give the job more memory, or "
                   "raise the container's memory limit.",
    "stray-context": "Call torch.cuda.set_device(local_rank) before any other CUDA call (or pass "
                     "device_id=torch.device('cuda', local_rank) to torch.distributed.init_process_group, and "
                     "device_ids=[local_rank] to barrier()), or give each rank only its own GPU with "
                     "CUDA_VISIBLE_DEVICES, so that its cuda:0 is its GPU.",
    "rank-imbalance": "Look for work that only this rank does: evaluation, logging or metrics gathered on "
                      "rank 0, a checkpoint gathered whole on one rank (torch.distributed.checkpoint saves "
                      "shards instead; FSDP's full state_dict with rank0_only=True and offload_to_cpu=True "
                      "keeps it off the GPU); uneven batches or padding (a sampler that gives one rank longer "
                      "sequences); or a leak on that rank (see its findings).",
    "orphan-process": "Wait for or stop the child before exiting (join(), terminate(), a context manager); to free "
                      "the memory now: kill {pid}.",
    "child-contexts": "Each process that touches CUDA pays its own context. If these processes only prepare "
                      "data, keep them on the CPU and send their results to the parent; if they must use the "
                      "GPU, use fewer of them.",
    "child-contexts-workers": "Keep CUDA out of DataLoader workers: return CPU tensors from the Dataset, collate_fn "
                              "and worker_init_fn, and move each batch to the GPU in the main process "
                              "(pin_memory=True makes the copy fast). Do not call torch.cuda.* (set_device, empty "
                              "tensors on cuda) in worker_init_fn.",
    "library-memory": "Nothing to do if {label} needs it; otherwise {switch}.",
    # an accumulation whose container keeps CUDA graphs, each holding its private pool (suspects.py)
    "graph-pools-kept": "{name} keeps CUDA graphs, and each graph keeps its private memory pool (captured{at}) "
                        "for as long as it lives, replayed or not. Capture one graph per bucket of sizes (pad "
                        "each batch up to a few fixed sizes), share one pool between graphs that never replay "
                        "at once (torch.cuda.graph(g, pool=other.pool())), or drop the graphs no longer "
                        "replayed (with their static inputs and outputs), then torch.cuda.empty_cache().",
    # an out-of-memory error of cause "full" whose step was asked for more than any before it
    # (out_of_memory._larger_step)
    # ({earlier}: the earlier steps' allocated peak, {at}: their inputs, {own}: the step's own tensors at the
    # error; out_of_memory.larger_step_remedy)
    "oom-larger-step": "This step needed more than any before it. In order: cap or bucket the sequence length "
                        "(truncate, sort batches by length, or a token budget per batch instead of a fixed batch "
                        "size), or split the longest batches: the steps before it needed at most {earlier}{at}; "
                        "gradient checkpointing (model.gradient_checkpointing_enable() in transformers, "
                        "torch.utils.checkpoint) keeps fewer activations{own}; and torch.autocast('cuda', "
                        "dtype=torch.bfloat16) halves most of what is left.",
}

# What the memory outside PyTorch's remedy gains where its evidence says more (non_torch.finding):
# NCCL's process groups grew (said before the rest), CuPy's pool ({total}, {used} of it in use) and
# NCCL in use (said after it).
NON_TORCH_MORE: dict[str, str] = {
    "nccl-growth": "Make process groups once, outside the loop, and reuse them; "
                   "torch.distributed.destroy_process_group(group) releases one no longer needed. Each NCCL "
                   "communicator's buffers are sized by NCCL_BUFFSIZE and its channels (NCCL_MAX_NCHANNELS). ",
    "cupy-pool": " CuPy's pool holds {total} ({used} in use): cupy.get_default_memory_pool().free_all_blocks() "
                 "returns the rest.",
    "nccl": " NCCL is in use in this process: its buffers lie outside PyTorch too, until "
            "torch.distributed.destroy_process_group() releases its communicators.",
}

# The switch that governs each other GPU library's memory (libraries.LIBRARIES), after its name in
# the memory outside PyTorch's remedy, and in its pool's own (FINDINGS["library-memory"]).
LIBRARY_SWITCHES: dict[str, str] = {
    "jax": "XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand), or XLA_PYTHON_CLIENT_MEM_FRACTION=.25 "
           "(a smaller pool), set before JAX starts",
    "cupy": "cupy.get_default_memory_pool().free_all_blocks() gives the pool's free blocks back; "
            "cupy.cuda.set_allocator(None) turns the pool off",
    "numba": "drop the arrays (del); Numba frees device memory when they go",
    "tensorflow": "TF_FORCE_GPU_ALLOW_GROWTH=true, or tf.config.experimental.set_memory_growth(gpu, True)",
}

# An out-of-memory error's remedy, by its cause (judgement row 5).
OUT_OF_MEMORY: dict[str, str] = {
    "accumulation": "Fix the leak above; the error is its consequence.",
    "request-too-large": "Make that tensor smaller (a smaller batch or sequence, chunking, a lower precision); no "
                         "amount of freeing makes it fit on this GPU.",
    "fragmentation": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of splitting), or "
                     "allocate the largest tensors first and keep their sizes steady; torch.cuda.empty_cache() "
                     "before the big allocation also helps.",
    "other-processes": "Stop or move the other processes (their PIDs are in the evidence; `gpumemdoctor ps` shows "
                       "them), or choose another GPU.",
    "full": "Use less memory per step: a smaller batch, activation checkpointing, mixed precision, or free what is "
            "no longer needed before this line.",
}


# The library loops that gather a model's outputs on the GPU (_agent/peak/reading.py's LIBRARY_LOOPS: the
# main thread's stack at a reading), each with its own switches, in the library's own terms.
_TRAINER = ("The Trainer gathers every batch's predictions on the GPU, concatenated to the ones before, until the "
            "evaluation ends: set TrainingArguments(eval_accumulation_steps=N) to move them to the CPU every N "
            "steps, and pass Trainer(preprocess_logits_for_metrics=...) to keep only what compute_metrics needs "
            "(logits.argmax(-1) instead of the vocabulary's logits).")
LIBRARY_LOOPS: dict[str, str] = {
    "transformers.Trainer.evaluation_loop": _TRAINER,
    "transformers.Trainer.prediction_loop": _TRAINER,
    "lightning.validation": (
        "Lightning's validation loop ran while the memory was gathered: what validation_step returns, or keeps "
        "in a list on the module (validation_step_outputs), or a callback's on_validation_batch_end keeps, stays "
        "on the GPU until the epoch ends: keep .detach().cpu() copies or numbers, or update a torchmetrics metric "
        "per batch, and clear the list in on_validation_epoch_end."),
}


# What would have made an out-of-memory error fit (fit.py), by the part the program could have freed;
# fragmentation and other processes take OUT_OF_MEMORY's.
FIT: dict[str, str] = {
    "gradients": "Call optimizer.zero_grad(set_to_none=True) before this code (or right after optimizer.step()): "
                 "the last step's gradients are otherwise held until the next backward().",
    "graphs": "Run this code under torch.no_grad() (or torch.inference_mode()), or keep loss.item() or "
              "x.detach() instead of the outputs: their autograd graphs hold every saved activation.",
    "kept": "Keep less: store a number (loss.item()) or a CPU copy (x.detach().cpu()), or bound the container.",
    "optimizer-state": "Create the optimizer after this code, or free its state before it (del optimizer, then "
                       "torch.cuda.empty_cache()) and load it back after; an optimizer that offloads its state "
                       "to the CPU keeps it off the GPU.",
}


def remedy(holder: dict, where: list | None, situation: str = "leak", ended_thread: bool = False) -> str:
    """The two sentences for one holder: what keeps the memory, what to change."""
    path, kind = holder["path"], holder["kind"]
    keeps, change = next((text for pattern, when, text in PATTERNS
                          if when in ("*", situation) and re.search(pattern, holder["pattern"])), (None, None))
    if keeps is None:
        keeps, change = (REMEDIES.get((kind, situation)) or REMEDIES.get((kind, "*"))
                         or REMEDIES.get(("*", situation)) or REMEDIES[(kind, "leak")])
    fn = path.split("'")[0]
    pattern = holder["pattern"]
    fields = {"path": path, "owner": path.split(".grad_fn")[0] if kind == "autograd-graph"
              else pattern.rsplit(".", 1)[0],
              "name": pattern, "attr": pattern.rsplit(".", 1)[-1].split("[")[0], "fn": fn,
              "short": fn.rsplit(".", 1)[-1], "at": at_text(where)}
    text = f"{keeps.format(**fields)} {change.format(**fields)}"
    return text + ENDED_THREAD if ended_thread else text


def unheld_remedy(why: list | None, where: list | None = None, graph_grads: int | None = None,
                  live: bool = False) -> str:
    """What to do about blocks without a holder, by why the search found none."""
    reason = why[0][0] if why else None
    if reason != "not-reached" and graph_grads:
        reason = "create-graph"
    elif live and reason in (None, "no-python-object"):
        reason = "live"
    grads = f"{graph_grads} tensor{'s' if graph_grads != 1 else ''}" if graph_grads else ""
    return UNHELD.get(reason or "no-python-object", UNHELD["no-python-object"]).format(at=at_text(where),
                                                                                   grads=grads)


def at_text(where: list | None) -> str:
    return f" (allocated at {where[0]}:{where[1]})" if where else ""
