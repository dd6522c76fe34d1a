"""``load_model`` tells the platform about the weights before it reads the checkpoint
into them, so a platform that maps memory its own way (the CPU's huge pages) has
nothing to move yet."""

from __future__ import annotations

from hf_checkpoints import make_checkpoint

from slotwise.platforms import get_current_platform
from slotwise_engine.models import loader


def test_every_weight_is_advised_before_the_checkpoint_is_read(tmp_path, monkeypatch):
    folder = make_checkpoint("llama-bias-linear", tmp_path / "llama")
    events: list[tuple[str, set[int]]] = []
    monkeypatch.setattr(
        get_current_platform(),
        "advise_resident_memory",
        lambda tensors: events.append(("advise", {t.data_ptr() for t in tensors})),
    )
    read = loader.load_weights
    monkeypatch.setattr(
        loader,
        "load_weights",
        lambda model, checkpoint: (events.append(("read", set())), read(model, checkpoint)),
    )
    model = loader.load_model(folder)
    assert [kind for kind, _ in events] == ["advise", "read"]
    assert {p.data_ptr() for p in model.parameters()} <= events[0][1]
