"""An unmodified PyTorch Lightning DDP job (CPU, gloo): a few steps of a tiny
regression, launched by torchrun (Lightning takes its ranks from torchelastic)."""

import argparse
import json
import warnings

import torch

warnings.filterwarnings("ignore")
import pytorch_lightning as pl  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    args = ap.parse_args()
    pl.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    with open(f"{args.report}.{trainer.global_rank}", "w") as f:
        json.dump({"params": [round(float(p.sum()), 5) for p in model.parameters()]}, f)
    # As PyTorch asks of every job (Lightning's teardown leaves the group up): without
    # it gloo's threads may still hold work at interpreter exit, and a rank now and
    # then aborted there ("terminate called without an active exception", exit -6;
    # pytorch/pytorch#190489), failing this test twice in four full runs on 2 cores.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
