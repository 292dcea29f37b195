"""spmdtorch.compile replays a step whose arguments are on the default placement while its state is sharded.

Such an argument (a batch or labels moved with ``.to("xla")``, no annotation)
is re-homed onto the mesh of the sharded parameters by the traced program;
before, every call then looked like a new program and was traced again
(correct numbers at lazy-mode speed). Now the replay re-homes the argument
the same way.
"""

from __future__ import annotations

import numpy as np
import torch

import spmdtorch
from spmdtorch.debug import counter_value
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import mark_sharding


def test_unsharded_arguments_with_sharded_state_replay(devices8):
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    mark_sharding(model, mesh, {"0.weight": ("model", None), "2.weight": (None, "model")})
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    traces = []

    @spmdtorch.compile
    def step(x, y):
        traces.append(1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opts[0].step()
        opts[0].zero_grad()
        return loss

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
    replays = counter_value("CompiledReplay") or 0
    losses = [step(x.to("xla"), y.to("xla")).item() for x, y in data]  # neither argument annotated
    assert len(traces) <= 3
    assert (counter_value("CompiledReplay") or 0) - replays >= 3
    want = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(ref(x), y)
        loss.backward()
        opts[1].step()
        opts[1].zero_grad()
        want.append(loss.item())
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
