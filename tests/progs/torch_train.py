"""torch_train: a PyTorch training loop on the GPU, for the tests of ckpt on a real GPU
(tests/tests/gpu.rs, scripts/gpu-check.sh).

A small network learns a fixed random problem, one optimizer step per 10 ms, deterministic (fixed
seeds, deterministic algorithms): RESULT, a hash of every parameter at the end, equals an
uninterrupted run's only if the device memory (weights, optimizer state) and the host state came
back bit for bit after each restart. PASS when the loss went down and nothing failed.

Usage: torch_train.py [SECONDS=5] [WORKERS=0]   (WORKERS: DataLoader processes, CPU only)
"""
import hashlib
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    steps = max(1, int(seconds * 100))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    x = torch.randn(4096, 256)
    y = (x @ torch.randn(256, 1)).tanh()
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=256, shuffle=False, num_workers=workers, persistent_workers=workers > 0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.cuda.synchronize()
    # Once CUDA is up: a checkpoint during its start is not what these tests are about.
    print("START", flush=True)
    first = last = None
    step = 0
    while step < steps:
        for xb, yb in loader:
            if step >= steps:
                break
            loss = torch.nn.functional.mse_loss(model(xb.to(dev)), yb.to(dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item()
            first = value if first is None else first
            last = value
            step += 1
            time.sleep(0.01)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    if last < first:
        print("PASS")
    else:
        print(f"FAIL the loss went from {first} to {last}")
    print("RESULT " + digest.hexdigest()[:16], flush=True)


main()
