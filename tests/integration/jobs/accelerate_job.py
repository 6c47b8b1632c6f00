"""An unmodified Hugging Face Accelerate job (CPU, gloo): prepare, a few steps,
a gather of the losses; launched by torchrun."""

import argparse
import json

import torch
from accelerate import Accelerator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    args = ap.parse_args()
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=8))
    losses = []
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.gather(loss.detach()).mean().item())
        if step == 3:
            break
    acc.wait_for_everyone()
    with open(f"{args.report}.{acc.process_index}", "w") as f:
        json.dump({"losses": [round(v, 5) for v in losses],
                   "params": [round(float(p.sum()), 5) for p in acc.unwrap_model(model).parameters()]}, f)
    acc.end_training()


if __name__ == "__main__":
    main()
