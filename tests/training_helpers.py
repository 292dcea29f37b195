"""Helpers shared by the training-parity tests (importable: tests/ is on sys.path)."""


def train_eager(model, opt, batches, loss_fn):
    """Train ``model`` eagerly on CPU; return the loss of every step as floats."""
    losses = []
    for b in batches:
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
