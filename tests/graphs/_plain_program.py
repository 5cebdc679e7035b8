"""A graph runner written only against ``torch.cuda``, as an engine's own runner is: no harness API inside.

``GraphRunner`` warms its model up on a side stream, then captures one graph per bucket with
``torch.cuda.graph(graph, pool=..., stream=...)`` around the forward, all buckets in one pool, and
replays a bucket's graph after copying a batch into its static input, as SGLang's
``CudaGraphRunner`` does.  The region tests run it under a graph run and compare it with the
callable form and with eager.
"""

from __future__ import annotations

import torch


class TinyModel:
    """Two layers and a KV write: matmuls, an elementwise op, an in-place scatter, a view."""

    def __init__(self, device: str, hidden: int = 8, slots: int = 16) -> None:
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.randn(hidden, hidden, generator=gen).to(device)
        self.w2 = torch.randn(hidden, hidden, generator=gen).to(device)
        self.kv = torch.zeros(slots, hidden, device=device)

    def forward(self, x: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ self.w1)
        self.kv[loc] = h
        return (h @ self.w2)[:, : x.shape[1] // 2]


class GraphRunner:
    def __init__(self, model: TinyModel, buckets: tuple[int, ...], device: str) -> None:
        self.model = model
        self.buckets = buckets
        hidden = model.w1.shape[0]
        self.x = torch.zeros(max(buckets), hidden, device=device)
        self.loc = torch.zeros(max(buckets), dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in self.buckets:
                for _ in range(2):
                    self.model.forward(self.x[:bs], self.loc[:bs])
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.pool = torch.cuda.graph_pool_handle()
        for bs in self.buckets:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                assert torch.cuda.is_current_stream_capturing()
                self.outputs[bs] = self.model.forward(self.x[:bs], self.loc[:bs])
            self.graphs[bs] = graph

    def replay(self, x: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        bs = next(b for b in self.buckets if b >= x.shape[0])
        self.x[: x.shape[0]].copy_(x)
        self.x[x.shape[0]: bs].zero_()
        self.loc[: x.shape[0]].copy_(loc)
        self.loc[x.shape[0]: bs].zero_()  # padding rows write the dummy slot 0
        self.graphs[bs].replay()
        return self.outputs[bs][: x.shape[0]]


def capture_twice_nested(x: torch.Tensor) -> None:
    """Open a second capture region inside the first, which CUDA refuses."""
    outer = torch.cuda.CUDAGraph()
    inner = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        y = x * 2
        with torch.cuda.graph(inner):
            y.add_(1)
