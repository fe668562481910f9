"""The sparse K2.6 replica's layout matches the published model (counted, not written)."""

from __future__ import annotations

from model_replica import K26Spec, k26_tensors, nbytes, plan_shards, shard_name


def test_full_layout_counts():
    groups = k26_tensors(K26Spec())
    tensors = [t for g in groups for t in g]
    assert len(tensors) == 208_544
    total = sum(nbytes(d, s) for _, d, s in tensors)
    assert 550 * 1024 ** 3 < total < 560 * 1024 ** 3  # ~554 GiB / ~595 GB
    experts = [t for t in tensors if ".mlp.experts." in t[0]]
    assert len(experts) == 60 * 384 * 9
    packed = {t[2] for t in experts if t[0].endswith("gate_proj.weight_packed")}
    scales = {t[2] for t in experts if t[0].endswith("down_proj.weight_scale")}
    assert packed == {(2048, 7168 // 8)} and scales == {(7168, 2048 // 32)}


def test_shard_names_and_plan():
    assert shard_name(7, 64) == "model-00007-of-000064.safetensors"
    shards = plan_shards(k26_tensors(K26Spec.small()), 4)
    assert len(shards) == 4 and all(shards)
    assert sum(len(s) for s in shards) == sum(len(g) for g in k26_tensors(K26Spec.small()))
