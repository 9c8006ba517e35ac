"""The process grid: which rank is which (pipeline, data, tensor) coordinate."""

from types import SimpleNamespace

from pretrain.distributed.mesh import Layout


def parallel(tensor=1, pipeline=1):
    return SimpleNamespace(tensor=tensor, pipeline=pipeline)


def test_tensor_fastest_then_data_then_pipeline():
    layout = Layout.of(parallel(tensor=2, pipeline=2), world_size=8)
    assert layout.shape == (2, 2, 2)
    coords = [layout.coords(r) for r in range(8)]
    assert [(c.pipeline, c.data, c.tensor) for c in coords] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]


def test_data_parallel_only_is_the_rank_itself():
    layout = Layout.of(parallel(), world_size=4)
    assert layout.shape == (1, 4, 1)
    assert [layout.coords(r).data for r in range(4)] == [0, 1, 2, 3]
