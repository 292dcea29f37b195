"""The dispatcher's named errors."""

from __future__ import annotations

__all__ = ["DeviceMismatchError", "ForeachError", "MetaFactoryLeak"]


class DeviceMismatchError(RuntimeError):
    """An xla tensor met a non-scalar tensor on another device."""


class MetaFactoryLeak(DeviceMismatchError):
    """A plain ``meta`` tensor met xla tensors inside one op.

    XlaTensor's storage device is ``meta``, so a C++ composite op (``cov``,
    ``cosine_similarity``...) that builds a helper tensor with
    ``at::empty(..., self.options())`` gets a real meta tensor, which has no
    data. The device mode (``spmdtorch.tensor.device_mode``) catches this at
    the top-level torch call and runs it again under ``capture_meta_factories``,
    where such factories create xla tensors instead.
    """


class ForeachError(RuntimeError):
    """A ``_foreach_*`` call whose tensor lists do not line up."""
