# expect: leak
# expect-holder: __main__.errors[*].__traceback__
# expect-holder-kind: kept-exception
"""Every failed record is kept with its exception for a report at the end. The traceback of each
exception keeps the failing frame alive, and with it that frame's 64 MiB scratch buffer: 40
failures keep 2.5 GiB. There is no optimizer and no step mark, and the whole loop takes well
under 100 ms, so the growth has to be seen from the few samples of a very short run."""
from _common import need_cuda_torch

torch = need_cuda_torch()
errors = []


def decode(record):
    scratch = torch.empty(16 << 20, device="cuda")  # allocates 64 MiB, a local of this frame
    if record.shape[-1] != 512:
        raise ValueError(f"record has {record.shape[-1]} fields, expected 512")
    scratch[: record.numel()].copy_(record.flatten())
    return scratch


for i in range(40):
    record = torch.randn(4, 1024, device="cuda")
    try:
        decode(record)
    except ValueError as exc:
        errors.append(exc)  # kept for the report; its traceback keeps `scratch`
torch.cuda.synchronize()
print(f"{len(errors)} records failed")
