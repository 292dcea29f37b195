"""Checkpoint paths: what users pass, what Orbax accepts."""

from __future__ import annotations

import os
from typing import TypeAlias

from etils import epath

from spmdtorch.checkpoint.errors import CheckpointArgumentTypeError

__all__ = ["CheckpointPath", "checkpoint_path"]

#: What users may pass as a checkpoint location.
CheckpointPath: TypeAlias = "str | os.PathLike[str] | epath.Path"


def checkpoint_path(path: CheckpointPath, param: str = "path") -> epath.Path:
    """``path`` as an ``epath.Path``, made absolute when it is local.

    Orbax refuses relative directories ("Checkpoint path should be absolute");
    users naturally write ``"checkpoints/run1"``. Remote paths (``gs://...``)
    are left as they are.

    Raises:
        CheckpointArgumentTypeError: ``path`` is not a str / ``os.PathLike``,
            or is empty (which would mean the working directory); the message
            names ``param``.

    Example:
        >>> import os
        >>> str(checkpoint_path("ckpt")) == os.path.join(os.getcwd(), "ckpt")
        True
    """
    if not isinstance(path, (str, os.PathLike)) or path == "":
        raise CheckpointArgumentTypeError(
            f"{param} must be a checkpoint directory (a non-empty str or os.PathLike), got "
            f"{type(path).__name__} {path!r}"
        )
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    # Annotated: etils types the epath.Path constructor's result as Any.
    out: epath.Path = epath.Path(text if "://" in text else os.path.abspath(text))
    return out
