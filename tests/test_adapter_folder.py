"""OUT/adapter and OUT/checkpoint get the mode a plain mkdir gives under the user's umask, so a
model server or a sandbox running as another user can read an adapter (they are written in a
temporary folder and renamed into place; tempfile.mkdtemp's folders would be 0700)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from harnessrl.train.lora import write_adapter, write_checkpoint


class FakePeft:
    """Writes what peft's save_pretrained writes, minus the weights' content."""

    def save_pretrained(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            f.write("{}")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o077, 0o700)])
def test_the_adapter_and_the_checkpoint_take_the_umask(tmp_path, umask, mode):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    old = os.umask(umask)
    try:
        adapter = write_adapter(tmp_path, FakePeft(), "tiny-random", "a test")
        checkpoint = write_checkpoint(tmp_path, FakePeft(), optimizer, {"step": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(adapter.stat().st_mode) == mode
    assert stat.S_IMODE(checkpoint.stat().st_mode) == mode
    assert (adapter / "harnessrl.json").is_file() and (checkpoint / "state.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "checkpoint"]  # no temporary folder left
