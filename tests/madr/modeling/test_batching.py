"""madr.modeling.batching: a batch lands where the model's weights are (a GPU run's batches follow the model)."""

from __future__ import annotations

import torch

from madr.modeling.batching import TextBatch, batch_to, model_device


def test_batch_to_moves_every_tensor_and_keeps_a_batch_already_there():
    batch = TextBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
                      {"brand:phrase": torch.full((2, 1), -1)}, torch.zeros(2, 3))
    assert batch_to(batch, torch.device("cpu")) is batch
    moved = batch_to(batch, torch.device("meta"))  # a device every torch build has
    tensors = [moved.input_ids, moved.attention_mask, moved.aspect_present, *moved.aspect_labels.values()]
    assert all(t.device.type == "meta" for t in tensors)
    assert moved.aspect_labels.keys() == batch.aspect_labels.keys()
    assert moved.input_ids.shape == batch.input_ids.shape and moved.input_ids.dtype == torch.long


def test_model_device_is_where_the_weights_are():
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(torch.nn.Identity()) == torch.device("cpu")  # no weights: the CPU
