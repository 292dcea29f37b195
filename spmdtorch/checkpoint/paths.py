"""Checkpoint paths: what users pass, what Orbax accepts."""

from __future__ import annotations

import os

from etils import epath

__all__ = ["checkpoint_path"]


def checkpoint_path(path) -> epath.Path:
    """``path`` as an ``epath.Path``, made absolute when it is local.

    Orbax refuses relative directories ("Checkpoint path should be absolute");
    users naturally write ``"checkpoints/run1"``. Remote paths (``gs://...``)
    are left as they are.

    Example:
        >>> import os
        >>> str(checkpoint_path("ckpt")) == os.path.join(os.getcwd(), "ckpt")
        True
    """
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    if "://" in text:
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))
