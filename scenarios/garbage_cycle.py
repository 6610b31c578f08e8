# expect: garbage-cycle
# expect-holder: Node.payload
# expect-args: --trace on
"""Tensors held by objects in reference cycles: unreachable, but only gc frees them."""
from _common import need_cuda_torch

torch = need_cuda_torch()


class Node:
    def __init__(self, parent=None):
        self.parent = parent
        self.children = []
        self.payload = torch.empty(16 << 20, device="cuda")  # allocates 64 MiB
        if parent is not None:
            parent.children.append(self)  # child -> parent -> child: a cycle


root = Node()
for _ in range(7):
    Node(root)
del root  # 8 x 64 MiB now unreachable, still allocated
print("dropped the tree")
