# expect: clean
# needs: timm
"""A timm ResNet-50 (random weights, nothing downloaded) trained as timm's train.py does it: the
optimizer from timm's factory (AdamW, weight decay off for biases and norms), a model EMA
(`timm.utils.ModelEmaV3`, or V2 in older timm) updated after every step, label smoothing, and bf16
autocast on batches of 128 x 3 x 224 x 224 random images in float32, `zero_grad(set_to_none=True)`,
40 steps. Its peak comes in a step's backward: the activations the forward saved for it (a few
GiB in bf16), over the float32 parameters (98 MiB), their gradients, AdamW's state (twice the
parameters) and the EMA's copy of the weights and buffers (about 98 MiB), which no optimizer
holds."""
from _common import StepClock, device, need, scaled

torch = need("torch")
timm, timm_optim, timm_utils = need("timm", "timm.optim", "timm.utils")

dev = device(torch)
torch.manual_seed(0)
model = timm.create_model("resnet50").to(dev)
model.train()
optimizer = timm_optim.create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
EmaV3 = getattr(timm_utils, "ModelEmaV3", None)  # newer timm; ModelEmaV2 before it
ema = EmaV3(model, decay=0.9998) if EmaV3 else timm_utils.ModelEmaV2(model, decay=0.9998)
loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
batch, size = scaled(128, 2), scaled(224, 64)
clock = StepClock()
for step in range(scaled(40)):
    images = torch.randn(batch, 3, size, size, device=dev)
    target = torch.randint(0, 1000, (batch,), device=dev)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = loss_fn(model(images), target)
    loss.backward()
    optimizer.step()
    if EmaV3:
        ema.update(model, step=step)
    else:
        ema.update(model)
    last = loss.item()
    clock.tick()
print(f"last loss {last:.3f}")
clock.report()
