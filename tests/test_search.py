"""The holder search and the garbage look-up (gpumemdoctor/_agent/search/search.py, heap.py, edges.py,
graphs.py, garbage.py) on CPU tensors: they match storages by address, so a CPU tensor is found the
same way a CUDA one is on the GPU."""
from __future__ import annotations

import functools
import gc
import itertools
import threading

import pytest

torch = pytest.importorskip("torch")

from gpumemdoctor._agent import garbage  # noqa: E402
from gpumemdoctor._agent.search import edges, search  # noqa: E402
from gpumemdoctor._agent.search.blocks import Spans, TensorKind, storage_span, thread_entry, user_frames  # noqa: E402

KIND = TensorKind(torch)
HISTORY: list = []


class Holder:
    def __init__(self, tensor):
        self.tensor = tensor


def block_of(tensor) -> dict:
    address, size = storage_span(tensor)
    return {"device": 0, "address": address, "size": size, "frames": [], "new": True}


def search_for(*tensors, budget_s: float = 10.0, blocks: list | None = None) -> dict:
    """The search over these tensors' blocks, from the usual roots (not this test's own frames),
    with automatic collection held off as the agent holds it."""
    blocks = blocks if blocks is not None else [block_of(t) for t in tensors]
    del tensors
    collecting = gc.isenabled()
    gc.disable()
    try:
        return search.investigate(torch, KIND, {"blocks": {}, "storages": set()}, budget_s,
                                  search.Roots({threading.get_ident()}), {}, blocks=blocks)
    finally:
        if collecting:
            gc.enable()


def holder_of(tensor) -> tuple[str, str]:
    """(rendered path, kind) of the path the search found to the tensor's storage."""
    result = search_for(tensor)
    (group,) = result["groups"]
    assert group["holders"], f"no holder: {group['unheld_why']} ({result['gave_up']})"
    return group["holders"][0]["path"], group["holders"][0]["kind"]


def test_a_module_global_list():
    HISTORY.extend(torch.zeros(4) for _ in range(3))
    try:
        path, kind = holder_of(HISTORY[2])
        assert path == f"{__name__}.HISTORY[2]"
        assert kind == "global"
        assert edges.pattern(path) == f"{__name__}.HISTORY[*]"
    finally:
        HISTORY.clear()


def test_an_object_attribute():
    global KEPT
    KEPT = {"cache": Holder(torch.ones(8))}
    try:
        path, kind = holder_of(KEPT["cache"].tensor)
        assert path == f"{__name__}.KEPT['cache'].tensor"
        assert kind == "attribute"
    finally:
        del KEPT


def work(errors: list):
    buf = torch.ones(16)  # noqa: F841 - held by the traceback's frame
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        errors.append(exc)


def test_a_kept_exception_holds_its_frame_locals():
    global ERRORS
    ERRORS = []
    work(ERRORS)
    buf = ERRORS[0].__traceback__.tb_frame.f_locals["buf"]
    try:
        path, kind = holder_of(buf)
        assert path.startswith(f"{__name__}.ERRORS[0].__traceback__ -> work() at test_search.py:")
        assert path.endswith(" local buf")
        assert kind == "kept-exception"
        assert edges.pattern(path) == f"{__name__}.ERRORS[*].__traceback__ -> work() at test_search.py local buf"
    finally:
        del ERRORS, buf


def test_a_forward_hook_closure():
    global MODEL
    MODEL = torch.nn.Linear(4, 4)
    outputs = []
    MODEL.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
    MODEL(torch.ones(2, 4))
    try:
        path, kind = holder_of(outputs[0])
        assert path.startswith(f"{__name__}.MODEL._forward_hooks[")
        assert path.endswith(" closure outputs[0]")
        assert kind == "hook"
    finally:
        del MODEL


def test_an_accumulated_loss_keeps_the_autograd_graph():
    global TOTAL
    w = torch.ones(64, 64, requires_grad=True)
    TOTAL = 0
    saved = []
    for _ in range(3):
        y = torch.tanh(torch.ones(8, 64) @ w)
        saved.append(y.grad_fn._saved_result)  # tanh saves its result for backward
        TOTAL = TOTAL + y.sum()
        del y
    first = saved[0]
    del saved  # now only the graph holds them
    try:
        path, kind = holder_of(first)
        assert path.startswith(f"{__name__}.TOTAL.grad_fn")
        assert "TanhBackward" not in path or "_saved_result" in path
        assert path.endswith("._saved_result")
        assert kind == "autograd-graph"
        assert " autograd node" in path  # the hops are counted, not spelled out
        assert edges.pattern(path) == f"{__name__}.TOTAL.grad_fn (autograd graph)"
    finally:
        del TOTAL, first


def test_graphs_kept_after_their_backward_are_not_walked():
    """Outputs kept after backward() keep graphs whose saved tensors are freed: each is read to
    its first node with saved tensors and no further (the walk of every such graph took 0.46 s at
    the exit of corpus/hf_gpt2_kept_outputs.py on an H100, and ran the search out of budget)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for _ in range(20):
        out = model(torch.ones(8, 16))
        out.sum().backward()
        HISTORY.append(out)
    del out
    try:
        # a block nothing holds, so that the graphs are read at all
        loose = {"device": 0, "address": 16, "size": 1 << 20, "frames": [], "new": True}
        result = search_for(blocks=[block_of(t) for t in HISTORY] + [loose])
    finally:
        HISTORY.clear()
    assert result["graph_nodes"] == 20  # each graph's AddmmBackward0, whose saved mat1 is freed
    assert result["complete"] and result["gave_up"] is None
    (group,) = result["groups"]
    assert [h["pattern"] for h in group["holders"]] == [f"{__name__}.HISTORY[*]"]
    assert group["unheld_why"] == [["no-python-object", 1 << 20, 1, None]]


def test_a_saved_weight_changed_in_place_does_not_stop_the_walk():
    """A validation total that keeps its graphs (scenarios/leak_loss_graph.py): each graph saved the
    last layer's weight, which the optimizer has since changed in place, so reading it raises; the
    activation saved beside it is still there, and so is the graph below it: all of it is placed
    through the graph (on the H100 a walk that read such a node as freed left 73 blocks unplaced)."""
    global VAL
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    VAL = 0.0
    kept = []
    for _ in range(10):
        model(torch.ones(8, 64)).square().mean().backward()
        opt.step()
        batch = torch.randn(64, 64)
        hidden = model[1](model[0](batch))  # the first layer saves the batch, tanh its result
        kept += [block_of(batch), block_of(hidden)]
        VAL = VAL + model[2](hidden).abs().mean()
        del batch, hidden
    try:
        result = search_for(blocks=kept)
    finally:
        del VAL
    (group,) = result["groups"]
    assert [(h["pattern"], h["count"]) for h in group["holders"]] == [
        (f"{__name__}.VAL.grad_fn (autograd graph)", 20)]
    assert group["unheld_count"] == 0


def test_a_graph_node_read_from_a_reached_head_is_not_read_again():
    from gpumemdoctor._agent.search import graphs

    w = torch.ones(8, 8, requires_grad=True)
    shared = torch.tanh(torch.ones(4, 8) @ w)  # saved once, in the node both graphs share
    a, b = shared * 2, shared * 3
    spans = Spans([(*storage_span(shared.grad_fn._saved_result), "tanh")])

    def locate(t):
        span = storage_span(t)
        return spans.find(span[0]) if span else None

    class Open:
        def over(self):
            return False

    heads = [(a, ["a", ".grad_fn"], a.grad_fn), (b, ["b", ".grad_fn"], b.grad_fn)]
    reached, nodes, stopped = graphs.graph_holders(heads, locate, {}, 1, Open(), KIND, reached={id(a), id(b)})
    assert [labels[0] for _, labels in reached["tanh"]] == ["a"] and stopped is None
    unreached, more, _ = graphs.graph_holders(heads, locate, {}, 1, Open(), KIND)
    assert [labels[0] for _, labels in unreached["tanh"]] == ["a", "b"] and more > nodes


def test_a_local_of_a_live_frame_in_another_thread():
    started, stop = threading.Event(), threading.Event()
    box = []

    def worker():
        local_tensor = torch.ones(32)
        box.append(local_tensor.untyped_storage().data_ptr())
        started.set()
        stop.wait(10)

    t = threading.Thread(target=worker, name="probe-thread")
    t.start()
    started.wait(10)
    try:
        result = search_for(blocks=[{"device": 0, "address": box[0], "size": 128, "frames": [], "new": True}])
        (holder,) = result["groups"][0]["holders"]
        assert holder["path"].startswith("thread 'probe-thread': worker() at test_search.py:")
        assert holder["path"].endswith(" local local_tensor")
        assert holder["kind"] == "frame-local"
    finally:
        stop.set()
        t.join()


def test_a_class_attribute_of_the_programs_own_class():
    Holder.shared = torch.ones(4)
    try:
        path, _ = holder_of(Holder.shared)
        assert path == f"{__name__}.Holder.shared"
    finally:
        del Holder.shared


def test_a_search_out_of_budget_says_what_it_did_not_reach():
    HISTORY.extend(torch.ones(4) for _ in range(3))
    try:
        result = search_for(*HISTORY, budget_s=0.0)
    finally:
        HISTORY.clear()
    (group,) = result["groups"]
    assert group["holders"] == [] and group["unheld_why"] == [["not-reached", 48, 3, None]]
    assert result["gave_up"].startswith("stopped at its 0 s budget with 3 of 3 allocations not reached"), result["gave_up"]


def test_a_block_no_python_object_holds_is_said_so():
    result = search_for(blocks=[{"device": 0, "address": 16, "size": 1 << 20, "frames": [], "new": True}])
    (group,) = result["groups"]
    assert group["unheld_why"] == [["no-python-object", 1 << 20, 1, None]]
    assert result["gave_up"] is None


class Node:
    def __init__(self, tensor):
        self.tensor = tensor
        self.peer = None


def test_garbage_names_the_types_and_the_holder_in_the_cycle():
    gc.collect()
    a, b = Node(torch.ones(1024)), Node(torch.ones(10))
    a.peer, b.peer = b, a
    del a, b
    found = []
    old = gc.get_debug()
    gc.set_debug(old | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(old)
    found, gc.garbage[:] = list(gc.garbage), []
    # CPU tensors are not CUDA: treat them as such by describing with a kind that says yes.
    report = garbage._describe_garbage(found, KIND, None, cuda_only=False)
    del found
    gc.collect()
    assert ["Node", 2] in report["types"]
    assert report["cuda_tensors"] == 2 and report["cuda_tensor_bytes"] == 4096 + 40
    top = report["tensors"][0]
    assert top["holder"] == "Node.tensor" and top["bytes"] == 4096 + 40 and top["count"] == 2
    assert top["cycle"] == "Node.peer -> Node.peer -> Node"


def test_user_frames_drop_torch_and_find_the_thread_entry():
    frames = [("/x/site-packages/torch/nn/modules/linear.py", 125, "forward"),
              ("/home/u/train.py", 41, "step"),
              ("/home/u/train.py", 60, "worker"),
              ("/usr/lib/python3.12/threading.py", 1010, "run"),
              ("/usr/lib/python3.12/threading.py", 1073, "_bootstrap_inner"),
              ("/usr/lib/python3.12/threading.py", 1030, "_bootstrap")]
    assert user_frames(frames)[0] == ("/home/u/train.py", 41, "step")
    assert thread_entry(frames) == ("/home/u/train.py", "worker")
    assert thread_entry(frames[:3]) is None


def test_blocks_that_share_a_stack_group_together_each_with_its_own_holder():
    """_groups reads a stack's frames once for all the blocks allocated there (an exit search's
    hundreds of optimizer-state blocks share a few stacks): the same groups as one by one."""
    frames = (("/x/site-packages/torch/optim/adamw.py", 90, "step"), ("/home/u/train.py", 41, "step"),
              ("/home/u/train.py", 60, "worker"), ("/usr/lib/python3.12/threading.py", 1010, "run"),
              ("/usr/lib/python3.12/threading.py", 1073, "_bootstrap_inner"))
    blocks = [{"device": 0, "address": 100 * i, "size": 64, "frames": list(frames), "new": True} for i in range(1, 5)]
    blocks.append({"device": 0, "address": 900, "size": 32, "frames": list(frames[1:]), "new": True})

    class Placed:
        placed = {i: [f"__main__.state[{i}]"] for i in range(4)}
        why = {4: "no-python-object"}
        dead: dict = {}

    groups = search._groups(blocks, Placed, {("/home/u/train.py", "worker"): ["loader"]})
    assert len(groups) == 1  # the program's frames are the same: one group
    g = groups[0]
    assert g["count"] == 5 and g["bytes"] == 4 * 64 + 32 and g["thread"] == ["loader"]
    assert g["frames"][0] == ["/home/u/train.py", 41, "step"]
    assert [(h["pattern"], h["count"]) for h in g["holders"]] == [("__main__.state[*]", 4)]
    assert g["unheld_bytes"] == 32


def test_a_relative_file_name_is_not_kept_as_library_or_not(tmp_path, monkeypatch):
    from gpumemdoctor._agent.search import blocks

    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.chdir(site)
    assert blocks.is_library_file("mod.py") and blocks.is_library_file(str(site / "mod.py"))
    monkeypatch.chdir(tmp_path)
    assert not blocks.is_library_file("mod.py")  # the working folder moved: asked again
    assert "mod.py" not in blocks._LIBRARY_FILES and str(site / "mod.py") in blocks._LIBRARY_FILES


def test_a_path_renders_the_same_with_or_without_autograd_hops():
    import random

    pieces = ["__main__", "", "thread 7 (MainThread)", "['model']", "[3]", "['-1']", ".weight", ".grad",
              ".grad_fn", ".next_functions[0]", " -> ", " -> suspended generator g() at a.py:3 local x",
              "['.next_functions[']", "{key}", " (torch.Foo)", "[':7']"]
    rng = random.Random(5)
    for _ in range(20_000):
        labels = [rng.choice(pieces) for _ in range(rng.randrange(0, 7))]
        assert edges.render(labels) == edges._render_hops(labels), labels
    assert edges.render(["__main__", "['model']", ".w"]) == "__main__.model.w"
    assert edges.render(["thread 7", "['model']"]) == "thread 7['model']"


def test_the_labels_of_a_search_share_their_steps_without_holding_the_objects():
    class Box:
        pass

    root = Box()
    root.items = {"a": Box(), "b": Box()}
    memo: dict = {}
    first = edges.labels([root, root.__dict__, root.items, root.items["a"]], ["__main__", "['root']"], memo)
    second = edges.labels([root, root.__dict__, root.items, root.items["b"]], ["__main__", "['root']"], memo)
    assert first == edges.labels([root, root.__dict__, root.items, root.items["a"]], ["__main__", "['root']"])
    assert (first[2:], second[2:]) == ([".items", "['a']"], [".items", "['b']"])
    assert len(memo) == 3  # root -> its __dict__ (naming .items) is read once for both paths
    assert all(type(k) is int for key in memo for k in key)  # ids, never the objects
    assert not any(r is memo for r in gc.get_referrers(root.items["a"]))


def test_a_dicts_key_is_not_a_named_reference_but_its_value_is():
    key, value = object(), object()
    d = {key: value}
    assert edges.named(d, value) and not edges.named(d, key)
    assert edges.named([key], key)


def test_a_pattern_generalises_indexes_and_line_numbers_only():
    assert edges.pattern("__main__.opt.state[3]['exp_avg'] -> layers['12'][-1]") == \
        "__main__.opt.state[*]['exp_avg'] -> layers[*][*]"
    assert edges.pattern("a frame at train.py:41 -> x[':7']") == "a frame at train.py -> x['']"  # (after "at ")
    far = "a frame at train.py:41 -> " + "y" * 60 + ".ratio:3"
    assert edges.pattern(far) == "a frame at train.py -> " + "y" * 60 + ".ratio:3"
    assert edges.pattern("m.out.grad_fn.next_functions[0]") == "m.out.grad_fn (autograd graph)"
    assert edges.pattern("d[''] d['-'] d[-] d[1:2]") == "d[''] d['-'] d[-] d[1:2]"


def test_spans_find_addresses_inside_a_block_only():
    spans = Spans([(1000, 100, "a"), (2000, 10, "b")])
    assert spans.find(1000) == "a" and spans.find(1099) == "a" and spans.find(1100) is None
    assert spans.find(999) is None and spans.find(2005) == "b"


def test_spans_find_a_tensors_block_from_any_view_of_it():
    base = torch.zeros(64)
    other = torch.zeros(8)
    spans = Spans([(*storage_span(base), "base")])
    assert spans.of_tensor(base) == "base" and spans.of_tensor(base[40:]) == "base"
    assert spans.of_tensor(base[64:]) == "base"  # empty, found by its storage
    assert spans.of_tensor(other) is None


def test_investigate_groups_new_blocks_by_stack_and_names_the_holder(monkeypatch):
    """The whole investigation over an allocator snapshot stand-in: blocks are CPU storages,
    with the stacks PyTorch would have recorded."""
    old = torch.ones(8)
    HISTORY.extend(torch.ones(256) for _ in range(4))
    stack = [{"filename": "/site-packages/torch/random.py", "line": 3, "name": "randn"},
             {"filename": "/home/u/train.py", "line": 41, "name": "step"}]

    def blocks(tensors, frames):
        out = []
        for t in tensors:
            address, size = storage_span(t)
            out.append({"address": address, "size": size, "state": "active_allocated", "frames": frames})
        return out

    state = {"blocks": blocks([old], [])}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot",
                        lambda: {"segments": [{"device": 0, "blocks": state["blocks"]}]})
    try:
        baseline = search.take_baseline(torch, KIND)
        state["blocks"] = blocks([old], []) + blocks(HISTORY, stack)
        result = search.investigate(torch, KIND, baseline, 10, search.Roots({threading.get_ident()}), {})
    finally:
        HISTORY.clear()
    assert result["candidate_count"] == 4 and result["candidate_bytes"] == 4 * 1024
    (group,) = result["groups"]
    assert group["frames"] == [["/home/u/train.py", 41, "step"]]
    assert group["count"] == 4 and group["unheld_bytes"] == 0
    (holder,) = group["holders"]
    assert holder["pattern"] == f"{__name__}.HISTORY[*]" and holder["count"] == 4
    from gpumemdoctor.recording import records
    from gpumemdoctor.diagnosis import suspects
    root = records.empty_root()
    records.apply_record(root, "investigation", {"when": "exit", "t": 5.0, "step": 40, "trace": True,
                                                   **result}, t0=1.0)
    found, meta = suspects.leak_suspects(root, 0)
    assert meta["searched"] and meta["t"] == 4.0
    assert found[0]["where"] == ["/home/u/train.py", 41, "step"]
    assert found[0]["summary"].startswith("4.00 KiB in 4 allocations at train.py:41 in step(); held by ")
    assert "(allocated at /home/u/train.py:41)" in found[0]["remedy"]


def test_the_exit_search_covers_all_live_memory_new_and_old(monkeypatch):
    """At exit every live block is searched, each group marked new (since the baseline) or not:
    a leak's suspects come from the new groups only, the live-at-exit suspects from all."""
    global WEIGHTS
    WEIGHTS = [torch.ones(512) for _ in range(3)]
    HISTORY.extend(torch.ones(256) for _ in range(4))
    snap = {"blocks": []}

    def block(t):
        address, size = storage_span(t)
        return {"address": address, "size": size, "state": "active_allocated", "frames": []}

    monkeypatch.setattr(torch.cuda.memory, "_snapshot",
                        lambda: {"segments": [{"device": 0, "blocks": snap["blocks"]}]})
    try:
        snap["blocks"] = [block(t) for t in WEIGHTS]
        baseline = search.take_baseline(torch, KIND)
        snap["blocks"] += [block(t) for t in HISTORY]
        result = search.investigate(torch, KIND, baseline, 10, search.Roots({threading.get_ident()}), {},
                                    all_live=True)
        only_new = search.investigate(torch, KIND, baseline, 10, search.Roots({threading.get_ident()}), {})
    finally:
        HISTORY.clear()
        del WEIGHTS
    assert result["all_live"] is True and result["candidate_count"] == 4
    assert sorted((g["new"], g["count"]) for g in result["groups"]) == [(False, 3), (True, 4)]
    assert [(g["new"], g["count"]) for g in only_new["groups"]] == [(True, 4)]
    from gpumemdoctor.recording import records
    from gpumemdoctor.diagnosis import suspects
    root = records.empty_root()
    records.apply_record(root, "investigation", {"when": "exit", "t": 5.0, "step": None, "trace": False,
                                                   **result}, t0=0.0)
    leak, _ = suspects.leak_suspects(root, 0)
    assert [s["holders"][0]["pattern"] for s in leak] == [f"{__name__}.HISTORY[*]"]
    live, meta = suspects.live_suspects(root, 0)
    assert meta["searched"] and meta["allocation_stacks"] is False
    # Without stacks, one suspect per holder, biggest first.
    assert [(s["holders"][0]["pattern"], s["bytes"]) for s in live] == [
        (f"{__name__}.WEIGHTS[*]", 3 * 2048), (f"{__name__}.HISTORY[*]", 4 * 1024)]
    assert live[0]["summary"] == f"6.00 KiB in 3 tensors held by {__name__}.WEIGHTS[0] and 2 more like it"
    assert "still references it" in live[0]["remedy"]


def test_the_exit_sequence_sees_the_cycle_when_gc_is_held_off(monkeypatch):
    """As the agent does at exit: gc off, a search that allocates a lot, then the garbage look-up.
    With gc on, the search's allocations set off a collection that frees the cycle unseen."""
    gc.collect()
    ring = [Node(torch.ones(1 << 14)) for _ in range(8)]
    for a, b in zip(ring, ring[1:] + ring[:1]):
        a.peer = b  # one cycle through all 8
    del ring, a, b
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"segments": []})
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(2000):  # unrelated cyclic garbage, more of it than the ring (as at exit on the GPU)
            junk = Holder(None)
            junk.tensor = junk
        del junk
        search.investigate(torch, KIND, {"blocks": {(1, 1)}, "storages": set()}, 10,
                           search.Roots({threading.get_ident()}), {})
        report = garbage.collect_garbage(KIND, None, cuda_only=False)
    finally:
        if collecting:
            gc.enable()
    assert report["types"][0] == ["Node", 8]  # the ring's types, not the unrelated garbage's
    assert report["objects"] >= 2000
    assert report["cuda_tensors"] == 8 and report["cuda_tensor_bytes"] == 8 * 4 * (1 << 14)
    assert report["tensors"][0]["holder"] == "Node.tensor"


def test_a_leaks_allocations_after_the_trace_window_count_with_its_line():
    """--trace auto stops recording stacks after its window: the same leak's later blocks have
    no stack but the same holder, and are counted with the group that has the line."""
    from gpumemdoctor.recording import records
    from gpumemdoctor.diagnosis import suspects

    def group(frames, count, pattern="__main__.kept[*]"):
        return {"device": 0, "new": True, "bytes": count * 1024, "count": count, "frames": frames,
                "thread": None, "holders": [{"path": "__main__.kept[0]", "pattern": pattern, "kind": "global",
                                             "count": count, "bytes": count * 1024, "sizes": None}],
                "unheld_bytes": 0, "unheld_count": 0, "unheld_sizes": None}

    line = [["/home/u/train.py", 12, "step"]]
    root = records.empty_root()
    records.apply_record(root, "investigation", {
        "when": "exit", "t": 5.0, "step": 900, "trace": True, "source": "allocator", "all_live": True,
        "candidate_bytes": 200 * 1024, "candidate_count": 200, "visited": 10, "gave_up": None, "elapsed_s": 0.1,
        "groups": [group([], 170), group(line, 30), group([], 4, pattern="torch.optim.state[*]")]}, t0=0.0)
    (suspect,) = suspects.leak_suspects(root, 0)[0]
    assert suspect["where"] == line[0] and suspect["count"] == 200 and suspect["bytes"] == 200 * 1024
    assert suspect["holders"][0]["count"] == 200
    assert suspect["summary"].startswith("200 KiB in 200 allocations at train.py:12 in step(); held by __main__.kept[0]")


def test_later_allocations_join_their_line_by_holder_not_by_group():
    """Once --trace auto's window has closed, the stackless blocks of one exit group are the leak's
    later ones and also this step's batch, a gradient and blocks nothing holds: only the blocks held
    like the leak's join its line (scenarios/oom_accumulation.py on the H100: 41 stackless blocks,
    40 of them the leak's, and 17 with the line)."""
    from gpumemdoctor.recording import records
    from gpumemdoctor.diagnosis import accumulations, suspects

    leak, batch = "__main__.outputs[*]", "__main__.x"
    stackless = {"device": 0, "new": True, "bytes": 44 * 1024, "count": 44, "frames": [], "thread": None,
                 "holders": [{"path": "__main__.outputs[60]", "pattern": leak, "kind": "global", "count": 40,
                              "bytes": 40 * 1024, "sizes": [[1024, 40]]},
                             {"path": batch, "pattern": batch, "kind": "global", "count": 1, "bytes": 1024,
                              "sizes": [[1024, 1]]}],
                 "unheld_bytes": 3 * 1024, "unheld_count": 3, "unheld_sizes": [[1024, 3]],
                 "unheld_why": [["no-python-object", 3 * 1024, 3, None]]}
    line = [["/home/u/train.py", 25, "<module>"]]
    framed = {"device": 0, "new": True, "bytes": 17 * 1024, "count": 17, "frames": line, "thread": None,
              "holders": [{"path": "__main__.outputs[3]", "pattern": leak, "kind": "global", "count": 17,
                           "bytes": 17 * 1024, "sizes": [[1024, 17]]}],
              "unheld_bytes": 0, "unheld_count": 0, "unheld_sizes": [], "unheld_why": []}
    root = records.empty_root()
    records.apply_record(root, "investigation", {
        "when": "exit", "t": 5.0, "step": 79, "trace": True, "source": "allocator", "all_live": True,
        "candidate_bytes": 61 * 1024, "candidate_count": 61, "visited": 10, "gave_up": None, "elapsed_s": 0.1,
        "groups": [stackless, framed]}, t0=0.0)
    top = suspects.leak_suspects(root, 0)[0][0]
    assert top["where"] == line[0] and top["count"] == 57 and top["bytes"] == 57 * 1024
    assert [(h["pattern"], h["count"], h["sizes"]) for h in top["holders"]] == [(leak, 57, [[1024, 57]])]
    assert top["unheld_bytes"] == 0
    # The same search read as accumulations (the out-of-memory error's, the exit's): the line is
    # the one its blocks with stacks were allocated at, though a stackless group came first.
    (held,), _ = accumulations.accumulations(root["investigations"][0], 0)
    assert held["pattern"] == leak and held["count"] == 57 and held["where"] == line[0]


# -- holders behind objects written in C, and what the climb reaches ---------------------------

@functools.lru_cache(maxsize=None)
def embed(i):
    return torch.full((8,), float(i))


@functools.lru_cache(maxsize=4)
def embed_bounded(i):
    return torch.full((8,), float(i))


@pytest.mark.parametrize("fn", [embed, embed_bounded], ids=["unbounded", "bounded"])
def test_an_lru_cache_is_named_as_the_functions_cache(fn):
    path, kind = holder_of(fn(3))
    assert path == f"{__name__}.{fn.__name__}'s lru_cache"
    assert kind == "cache"


def batches():
    buf = torch.ones(64)
    yield 1
    yield buf


def test_a_suspended_generators_local():
    global GENS
    GENS = [batches()]
    next(GENS[0])
    tensor = GENS[0].gi_frame.f_locals["buf"]
    try:
        path, kind = holder_of(tensor)
        assert path.startswith(f"{__name__}.GENS[0] -> suspended generator batches() at test_search.py:")
        assert path.endswith(" local buf")
        assert kind == "generator"
        assert edges.pattern(path) == f"{__name__}.GENS[*] -> suspended generator batches() at test_search.py local buf"
    finally:
        del GENS


def test_an_object_written_in_c_is_named_by_its_type():
    global REPEATS
    REPEATS = [itertools.repeat(torch.ones(4))]
    tensor = next(REPEATS[0])
    try:
        path, kind = holder_of(tensor)
        assert path == f"{__name__}.REPEATS[0] (itertools.repeat)"
        assert kind == "foreign"
    finally:
        del REPEATS


def test_a_librarys_global_is_reached_by_the_climb():
    import json

    json._gpumemdoctor_probe = [torch.ones(5)]
    try:
        result = search_for(json._gpumemdoctor_probe[0])
        (holder,) = result["groups"][0]["holders"]
        assert holder["path"] == "json._gpumemdoctor_probe[0]"
        assert result["phases"]["climb_scans"] >= 1
    finally:
        del json._gpumemdoctor_probe


def test_a_climb_starts_no_heap_scan_that_would_pass_the_budget():
    """A scan of a big heap cannot be stopped midway: one expected to take longer than the budget
    has left is not started (the search stays within its budget and says why it stopped)."""
    from gpumemdoctor._agent.search import heap

    held = [torch.ones(5)]
    roots = {id(held)}
    slow = heap.Climb(roots, set(), heap.Budget(0.5), scan_s=1.0)
    slow.run([held[0]])
    assert slow.scans == 0 and slow.stopped == "time" and not slow.chains
    fast = heap.Climb(roots, set(), heap.Budget(0.5), scan_s=0.0)
    fast.run([held[0]])
    assert fast.scans == 1 and fast.chains[id(held[0])][0] is held
    assert fast.scan_s > 0  # the scan was timed: the next climb expects as much


def test_a_search_whose_next_scan_would_not_fit_stops_within_budget(monkeypatch):
    import json

    json._gpumemdoctor_probe = [torch.ones(5)]
    real = search.Finder._sweep

    def after_slow_anchors(self, *args):  # as if the heap were so big that the anchors took 30 s
        self.phases["anchors_s"] = 30.0
        return real(self, *args)

    monkeypatch.setattr(search.Finder, "_sweep", after_slow_anchors)
    try:
        # The budget is far above what the real passes take, even on a loaded machine (they took
        # 0.3 s in a busy -n 4 run), and far below the scan the climb would expect.
        result = search_for(json._gpumemdoctor_probe[0], budget_s=5.0)
        (group,) = result["groups"]
        assert not group["holders"] and group["unheld_why"]
        assert "would pass the budget" in result["gave_up"] and result["elapsed_s"] < 5.0
        assert result["phases"]["climb_scans"] == 0
    finally:
        del json._gpumemdoctor_probe


def test_one_climb_places_a_whole_list_beside_the_first():
    import json

    json._gpumemdoctor_many = [torch.ones(5) for _ in range(50)]
    try:
        result = search_for(*json._gpumemdoctor_many)
        (holder,) = result["groups"][0]["holders"]
        assert holder["pattern"] == "json._gpumemdoctor_many[*]" and holder["count"] == 50
        assert result["phases"]["climb_scans"] <= 4  # one climb, not fifty
    finally:
        del json._gpumemdoctor_many


def test_a_big_container_is_left_to_the_climb():
    """The sweep does not walk into a list of more than heap.BIG items; the climb finds what is
    held below one."""
    global DATASET
    DATASET = [[i] for i in range(search.heap.BIG + 10)]
    DATASET[-1].append(torch.ones(3))
    try:
        path, _ = holder_of(DATASET[-1][1])
        assert path == f"{__name__}.DATASET[{search.heap.BIG + 9}][1]"
    finally:
        del DATASET


def test_a_tensor_held_only_by_a_dead_cycle_is_unreachable():
    class Ring:
        pass

    a, b = Ring(), Ring()
    a.peer, b.peer, a.t = b, a, torch.ones(7)
    block = block_of(a.t)
    del a, b
    result = search_for(blocks=[block])
    (group,) = result["groups"]
    assert group["holders"] == [] and group["unheld_why"][0][0] == "unreachable"


class Sneaky:
    """A class whose every hook counts its calls: the search must never call any of them."""

    calls = 0

    def __getattr__(self, name):
        Sneaky.calls += 1
        raise AttributeError(name)

    def __getattribute__(self, name):
        Sneaky.calls += 1
        return object.__getattribute__(self, name)

    def __repr__(self):
        Sneaky.calls += 1
        return "sneaky"

    def __len__(self):
        Sneaky.calls += 1
        return 1

    def __iter__(self):
        Sneaky.calls += 1
        return iter(())

    def __eq__(self, other):
        Sneaky.calls += 1
        return self is other

    def __hash__(self):
        Sneaky.calls += 1
        return 7

    def __dir__(self):
        Sneaky.calls += 1
        return []

    @property
    def prop(self):
        Sneaky.calls += 1
        return 1


class SneakyList(list):
    def __iter__(self):
        Sneaky.calls += 1
        return iter(())

    def __getitem__(self, i):
        Sneaky.calls += 1
        return None


def test_the_search_runs_none_of_the_programs_code():
    global SNEAKY
    outer, inner = Sneaky(), Sneaky()
    tensor = torch.ones(3)
    object.__setattr__(inner, "t", SneakyList([tensor]))
    object.__setattr__(outer, "inner", inner)
    SNEAKY = {(outer, 1): [outer]}  # a key that is a tuple holding an object of the program's class
    Sneaky.calls = 0
    try:
        result = search_for(tensor)
        (holder,) = result["groups"][0]["holders"]
        assert holder["path"] == f"{__name__}.SNEAKY[<tuple>][0].inner.t[0]"
        assert Sneaky.calls == 0
    finally:
        del SNEAKY


def test_a_snapshot_does_not_import_torch_inductor_into_the_program(monkeypatch):
    """PyTorch names a snapshot's Python frames after asking hasattr(torch, "_inductor"), which
    imports torch._inductor (seconds, hundreds of modules) in a program that never did."""
    import sys
    import types

    from gpumemdoctor._agent.search.blocks import no_inductor_import

    # a program that has not imported it (an earlier test's optimizer step may have, in this process)
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)

    imported = []
    fake = types.ModuleType("faketorch")
    fake.__getattr__ = lambda name: imported.append(name) or (_ for _ in ()).throw(AttributeError(name))
    with no_inductor_import(fake):
        inductor = getattr(fake, "_inductor")  # what PyTorch's C++ does, through hasattr
        assert not hasattr(inductor, "codecache")
    assert imported == [] and "_inductor" not in vars(fake)
    real = object()
    fake._inductor = real  # a program that imported it keeps its own
    with no_inductor_import(fake):
        assert fake._inductor is real
    assert fake._inductor is real


def test_tensors_nothing_refers_to_are_unreachable_without_a_climb_each(monkeypatch):
    """Tensors kept alive from C++ only (as autograd keeps a create_graph leaf) have no referrer:
    one scan before the climb says so for many at once. (The scan asks about at most
    PREPASS_REFERENCES // heap objects of them: lifted here, so that the test suite's own heap, over
    500,000 objects in a serial run, does not decide how many that is.)"""
    from gpumemdoctor._agent.search import search as search_module

    monkeypatch.setattr(search_module, "PREPASS_REFERENCES", 1 << 40)
    kept = [torch.ones(3) for _ in range(40)]
    blocks = [block_of(t) for t in kept]
    # The test's own list is its frame's local (not searched) and refers to them: hide it from the
    # search by keeping the tensors alive through an object the gc does not track.
    import array
    import ctypes

    ids = array.array("q", (id(t) for t in kept))
    for t in kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    del kept, t
    try:
        result = search_for(blocks=blocks)
        (group,) = result["groups"]
        assert group["unheld_why"][0][:3] == ["unreachable", 40 * 12, 40]
        assert result["phases"]["unreferred"] == 40 and result["phases"].get("climb_scans", 0) == 0
    finally:
        for i in ids:
            ctypes.pythonapi.Py_DecRef(ctypes.cast(i, ctypes.py_object))


class CountingTensor(torch.Tensor):
    """A tensor subclass whose autograd and storage accessors are the program's own code."""

    calls = 0

    @property
    def requires_grad(self):
        CountingTensor.calls += 1
        return torch._C.TensorBase.requires_grad.__get__(self)

    @property
    def grad_fn(self):
        CountingTensor.calls += 1
        return torch._C.TensorBase.grad_fn.__get__(self)

    @property
    def grad(self):
        CountingTensor.calls += 1
        return torch._C.TensorBase.grad.__get__(self)

    def untyped_storage(self):
        CountingTensor.calls += 1
        return torch._C.TensorBase.untyped_storage(self)


def test_the_search_runs_no_accessor_of_a_tensor_subclass():
    global COUNTED
    leaf = torch.ones(4, requires_grad=True)
    COUNTED = [(leaf * 2).as_subclass(CountingTensor), torch.ones(5).as_subclass(CountingTensor)]
    block = block_of(COUNTED[1])
    CountingTensor.calls = 0
    try:
        result = search_for(blocks=[block])
        (group,) = result["groups"]
        assert group["holders"][0]["path"] == f"{__name__}.COUNTED[1]"
        assert CountingTensor.calls == 0
    finally:
        del COUNTED


def test_the_exit_search_of_a_clean_run_takes_at_most_one_percent_of_the_run():
    from gpumemdoctor._agent.growth_watch import BUDGET_S, budget_for

    assert budget_for("live", 50.0) == 0.5  # a 50 s run's end is delayed by at most 1%
    assert budget_for("live", 3.0) == 0.25  # never less than 0.25 s
    assert budget_for("live", 600.0) == 1.0  # never more than the exit's 1 s
    assert budget_for("exit", 3.0) == BUDGET_S["exit"] == 1.0  # a run that grew: its holders matter more
    assert budget_for("growth", 3.0) == 5.0


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: a graph whose private pool is `pool_id`."""

    def __init__(self, pool_id):
        self.pool_id = pool_id


def test_a_cuda_graphs_pool_is_held_by_the_graph_with_its_capture_line(monkeypatch):
    """Issue 56: each segment of a CUDA graph's private pool is a block of its own, held by the graph
    whose pool it is (not by the static output inside it), with the stack of the capture's allocation;
    the default pool's blocks are searched as before."""
    from gpumemdoctor._agent.search import blocks as blocks_module
    from gpumemdoctor.contract import GRAPH_POOL_LABEL

    segment = torch.ones(4096)  # the pool's segment; the static output lies inside it
    static_input, static_output = torch.ones(512), segment[:256]
    HISTORY.append((FakeGraph((1, 7)), static_input, static_output))
    capture = [{"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
               {"filename": "/home/u/serve.py", "line": 33, "name": "capture"}]
    made = [{"filename": "/home/u/serve.py", "line": 24, "name": "capture"}]

    def snap():
        address, size = storage_span(segment)
        pool_blocks = [{"address": address, "size": 1024, "state": "active_allocated", "frames": capture},
                       {"address": address + 1024, "size": size - 1024, "state": "inactive", "frames": []}]
        address_in, size_in = storage_span(static_input)
        return {"segments": [
            {"device": 0, "address": address_in, "total_size": size_in, "segment_pool_id": (0, 0),
             "blocks": [{"address": address_in, "size": size_in, "state": "active_allocated", "frames": made}]},
            {"device": 0, "address": address, "total_size": size, "segment_pool_id": (1, 7), "blocks": pool_blocks}]}

    monkeypatch.setattr(torch.cuda.memory, "_snapshot", snap)
    monkeypatch.setattr(blocks_module, "graph_types", lambda torch: {FakeGraph})
    monkeypatch.setattr(blocks_module, "graph_pool", lambda torch, g: getattr(g, "pool_id", None))
    collecting = gc.isenabled()
    gc.disable()
    try:
        assert [b.get("pool") for b in blocks_module.live_blocks(torch)] == [None]  # as before, by default
        result = search.investigate(torch, KIND, {"blocks": {}, "storages": set()}, 10,
                                    search.Roots({threading.get_ident()}), {}, all_live=True, first=True)
    finally:
        HISTORY.clear()
        if collecting:
            gc.enable()
    by_line = {g["frames"][0][1]: g for g in result["groups"]}
    pool = by_line[33]
    assert pool["bytes"] == 4096 * 4 and pool["frames"][0] == ["/home/u/serve.py", 33, "capture"], pool
    (holder,) = pool["holders"]
    assert holder["path"] == f"{__name__}.HISTORY[0][0]{GRAPH_POOL_LABEL}", holder
    assert by_line[24]["holders"][0]["path"] == f"{__name__}.HISTORY[0][1]"


def test_a_snapshot_for_segments_leaves_the_event_ring_out_where_pytorch_can(monkeypatch):
    """The growth watch's baseline, the searches and the pools read only the segments: they ask
    PyTorch for every pool's segments without the event ring (0, 0, False), which a full history
    ring made cost milliseconds at a step; an older PyTorch that refuses the three items is asked
    for the whole snapshot."""
    from types import SimpleNamespace

    from gpumemdoctor._agent.search import blocks

    asked, whole = [], []
    segments = [{"device": 0, "blocks": [{"address": 64, "size": 512, "state": "active_allocated", "frames": []}]}]

    def memory_snapshot(pool):
        asked.append(pool)
        return {"segments": segments}

    fake = SimpleNamespace(_C=SimpleNamespace(_cuda_memorySnapshot=memory_snapshot),
                           cuda=SimpleNamespace(memory=SimpleNamespace(
                               _snapshot=lambda: whole.append(1) or {"segments": [], "device_traces": [[]]})))
    given = []
    monkeypatch.setattr(blocks, "py_incref", lambda: given.append)
    assert blocks.live_blocks(fake) == [{"device": 0, "address": 64, "size": 512, "frames": []}]
    assert asked == [(0, 0, False)] and whole == []
    assert given == [0, 0, False]  # the references a PyTorch that takes the items as its own lets go

    def refuses(pool):
        raise TypeError("mempool_id must be a tuple of two integers")

    fake._C._cuda_memorySnapshot = refuses
    assert blocks.snapshot(fake) == {"segments": [], "device_traces": [[]]} and whole == [1]
    del fake._C._cuda_memorySnapshot  # a PyTorch without the binding (a CPU build)
    assert blocks.snapshot(fake)["segments"] == [] and whole == [1, 1]
