"""The KV cache write of a step (talker_service.model.layers.write_and_read_kv): its index_copy_
equals the advanced-indexing assignment it replaced, to the bit, for every slot mapping (a
slot tensor, one slot, or rows 0..B-1), and reads back the rows it wrote."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.model.layers import AttentionSpec, write_and_read_kv


@settings(max_examples=60, deadline=None)
@given(
    slots_total=st.integers(1, 6),
    kv=st.integers(1, 3),
    max_len=st.integers(1, 12),
    hd=st.integers(1, 5),
    mapping=st.sampled_from(["tensor", "int", "none"]),
    data=st.data(),
)
def test_write_equals_advanced_indexing(
    slots_total: int, kv: int, max_len: int, hd: int, mapping: str, data: st.DataObject
) -> None:
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    if mapping == "tensor":
        rows = data.draw(st.lists(st.integers(0, slots_total - 1), min_size=1, unique=True))
    elif mapping == "int":
        rows = [data.draw(st.integers(0, slots_total - 1))]
    else:
        rows = list(range(data.draw(st.integers(1, slots_total))))
    b = len(rows)
    s = data.draw(st.integers(1, max_len))
    positions = torch.stack([torch.randperm(max_len, generator=g)[:s] for _ in range(b)])
    k_buf, v_buf = (torch.randn(slots_total, kv, max_len, hd, generator=g) for _ in range(2))
    k, v = (torch.randn(b, kv, s, hd, generator=g) for _ in range(2))
    want_k, want_v = k_buf.clone(), v_buf.clone()
    index = torch.tensor(rows)[:, None].expand(b, s)
    want_k[index, :, positions] = k.transpose(1, 2)
    want_v[index, :, positions] = v.transpose(1, 2)
    slots: int | torch.Tensor | None = {"tensor": torch.tensor(rows), "int": rows[0], "none": None}[mapping]
    attend = data.draw(st.integers(1, max_len))
    spec = AttentionSpec(positions=positions, slots=slots, attend_len=attend, mask=None, is_causal=False)
    got_k, got_v = write_and_read_kv(k_buf, v_buf, k, v, spec)
    assert torch.equal(k_buf, want_k) and torch.equal(v_buf, want_v)
    assert torch.equal(got_k, want_k[rows, :, :attend]) and torch.equal(got_v, want_v[rows, :, :attend])
