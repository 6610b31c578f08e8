# expect: leak
# expect-holder: __main__.graphs
"""A server that captures a CUDA graph for each new batch size, to replay it at once the next time
that size comes, and keeps every graph, with its static input and output, in a list: 40 graphs, one
per batch size (64 to 2560 rows of 8192 features through two linear layers under torch.no_grad()).
Each graph captured with torch.cuda.graph gets its own private memory pool: the blocks its capture
allocated stay reserved for the graph's replays, whether or not a tensor outside the graph still
refers to them (only the static output does). The pools are most of the memory: the graphs hold it,
not the program's free pieces. One graph more at each new size: a leak, held by `graphs`, allocated
at the marked line (the capture of the forward). The program prints its ground truth: the graphs,
their static inputs' and outputs' bytes, each private pool's reserved and allocated bytes (read
from torch.cuda.memory_snapshot()'s segment_pool_id), and PyTorch's figures."""
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
MiB, GiB = 1 << 20, 1 << 30
model = torch.nn.Sequential(torch.nn.Linear(8192, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 8192)).cuda().eval()
graphs = []  # (graph, static input, static output), one per batch size, never dropped


def capture(rows):
    static_input = torch.randn(rows, 8192, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up before capture, as torch.cuda.graph asks
        for _ in range(2):
            model(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_output = model(static_input)  # allocates in the graph's private pool
    return graph, static_input, static_output


for size in range(1, 41):
    rows = 64 * size
    graph, static_input, static_output = capture(rows)
    graphs.append((graph, static_input, static_output))
    for _ in range(3):  # requests of this size: copy in, replay
        static_input.copy_(torch.randn(rows, 8192, device="cuda"))
        graph.replay()
    torch.cuda.synchronize()
    time.sleep(0.03)

pools: dict = {}
for segment in torch.cuda.memory_snapshot():
    pool = tuple(segment.get("segment_pool_id", (0, 0)))
    reserved, allocated = pools.get(pool, (0, 0))
    pools[pool] = (reserved + segment["total_size"], allocated + segment["allocated_size"])
private = {p: v for p, v in pools.items() if p != (0, 0)}
inputs = sum(i.untyped_storage().nbytes() for _, i, _ in graphs)
outputs = sum(o.untyped_storage().nbytes() for _, _, o in graphs)
print(f"truth: {len(graphs)} graphs kept; static inputs {inputs / MiB:.0f} MiB, static outputs {outputs / MiB:.0f} MiB")
print(f"truth: {len(private)} private pools, reserved {sum(r for r, _ in private.values()) / MiB:.0f} MiB, "
      f"allocated {sum(a for _, a in private.values()) / MiB:.0f} MiB; the largest "
      f"{max((r for r, _ in private.values()), default=0) / MiB:.0f} MiB; the default pool reserved "
      f"{pools.get((0, 0), (0, 0))[0] / MiB:.0f} MiB")
print(f"truth: allocated {torch.cuda.memory_allocated() / GiB:.2f} GiB, reserved {torch.cuda.memory_reserved() / GiB:.2f} "
      f"GiB, max allocated {torch.cuda.max_memory_allocated() / GiB:.2f} GiB", flush=True)
