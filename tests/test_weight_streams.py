"""The pieces a weights stream travels in: bounded buckets, and buckets packed into bytes."""

import torch

from selfplay.backends.base import packed, unpacked, weight_buckets

TENSORS = [
    ("half", torch.randn(3, dtype=torch.bfloat16)),  # 6 bytes: what follows starts unaligned unless padded
    ("scalar", torch.tensor(2.5, dtype=torch.float64)),
    ("empty", torch.zeros(0, 4)),
    ("steps", torch.arange(5)),
    ("transposed", torch.randn(4, 3).t()),  # not contiguous
]


def assert_same(got, expected):
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (name, a), (_, b) in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_packed_tensors_of_any_dtype_and_shape_come_back_as_they_went():
    layout, flat = packed(TENSORS)
    assert flat.dtype == torch.uint8
    assert_same(unpacked(layout, flat), TENSORS)
    # Buckets packed one by one and laid end to end are the packing of them all: how a worker
    # gathers a stream that came in pieces.
    first_layout, first = packed(TENSORS[:2])
    rest_layout, rest = packed(TENSORS[2:])
    assert_same(unpacked(first_layout + rest_layout, torch.cat([first, rest])), TENSORS)


def test_buckets_keep_the_order_and_hold_at_most_their_bytes_unless_one_tensor_is_larger():
    weights = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([2, 2, 3, 10, 1, 1])]  # float32: 4 bytes each
    buckets = list(weight_buckets(weights, max_bytes=16))
    assert [[name for name, _ in bucket] for bucket in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4", "w5"]]
    (whole,) = weight_buckets(dict(weights), max_bytes=1 << 20)  # a mapping is its items
    assert_same(whole, weights)
