"""A Lightning fit of a few steps on the GPU (tests/gpu/check.sh): the model must end on cuda:LOCAL_DEVICE."""

from __future__ import annotations

import os
import sys

import torch

try:
    import lightning as L
except ImportError:
    import pytorch_lightning as L  # type: ignore[no-redef]


class Tiny(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.seen: set[str] = set()  # where the steps ran (Lightning moves the model back to the CPU at the end)

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        self.seen.add(str(self.layer.weight.device))
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = Tiny()
trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=16))
want = int(os.environ.get("SLURMLAUNCH_LOCAL_DEVICE", "0"))
ok = trainer.global_step == 3 and model.seen == {str(torch.device("cuda", want))}
print(f"PROBE lightning {L.__version__} steps={trainer.global_step} devices={sorted(model.seen)} "
      f"strategy={type(trainer.strategy).__name__} ok={ok}", flush=True)
sys.exit(0 if ok else 1)
