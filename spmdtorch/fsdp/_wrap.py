"""Auto-wrap policies and the recursive wrapper used by :class:`FSDPv2`.

A policy is a callable ``policy(module, recurse, nonwrapped_numel) -> bool``,
the contract of ``torch.distributed.fsdp.wrap`` and of PyTorch/XLA's
``torch_xla.distributed.fsdp.wrap``; torch's own policy functions (and
``ModuleWrapPolicy`` objects) therefore work here too. It is asked twice per
module:

* ``recurse=True``: should the walk descend into this module's children?
* ``recurse=False``: after the children were handled, should this module be
  wrapped (``nonwrapped_numel`` is then the count of its parameters that no
  wrapped child took)?

The policies here are plain Python (they do not need ``torch.distributed``,
which some torch builds lack) and give the same answers as torch's
functions of the same names; pass extra arguments with ``functools.partial``.

Example:
    >>> import functools
    >>> from spmdtorch.models.llama import DecoderLayer
    >>> from spmdtorch.fsdp import transformer_auto_wrap_policy
    >>> policy = functools.partial(transformer_auto_wrap_policy,
    ...                            transformer_layer_cls={DecoderLayer})
    >>> # FSDPv2(model, mesh=mesh, auto_wrap_policy=policy) wraps every DecoderLayer
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from spmdtorch import _checks
from spmdtorch._checks import ArgumentTypeError

__all__ = [
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]


def _iterable_of(value: Any, kind: type, param: str) -> list[Any]:
    """``list(value)`` if it is an iterable of ``kind`` instances, else ``ArgumentTypeError``."""
    if isinstance(value, (str, bytes, torch.Tensor, torch.nn.Module)) or not hasattr(value, "__iter__"):
        _checks.fail(ArgumentTypeError, "recursive_wrap", param, f"an iterable of {kind.__name__}", value)
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            _checks.fail(ArgumentTypeError, "recursive_wrap", f"{param}[{i}]", f"a {kind.__name__}", item)
    return items


def _classes(value: Any, param: str) -> tuple[type, ...]:
    """A set/list/tuple of module classes (or one class) → tuple of classes."""
    if isinstance(value, type):
        value = (value,)
    try:
        classes = tuple(value)
    except TypeError:
        raise ArgumentTypeError(
            f"{param} must be a set of nn.Module classes, got {type(value).__name__} {value!r}; "
            f"e.g. {param}={{DecoderLayer}}"
        ) from None
    for cls in classes:
        if not isinstance(cls, type):
            raise ArgumentTypeError(
                f"{param} must hold nn.Module classes, got {type(cls).__name__} {cls!r}; pass the "
                "class itself (DecoderLayer), not an instance or its name"
            )
    return classes


def transformer_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    transformer_layer_cls: Iterable[type],
) -> bool:
    """Wrap every module that is an instance of one of ``transformer_layer_cls``.

    Always descends (so layers nested at any depth are found) and wraps a
    module when it is an instance of one of the classes, whatever its size.

    Args:
        module: The module asked about.
        recurse: True when the question is "descend into its children?".
        nonwrapped_numel: Parameters of ``module`` not in a wrapped child
            (unused by this policy).
        transformer_layer_cls: The layer classes to wrap (a set; one class
            is accepted too).

    Returns:
        Whether to descend (``recurse``) or to wrap ``module``.

    Example:
        >>> import functools, torch
        >>> policy = functools.partial(transformer_auto_wrap_policy,
        ...                            transformer_layer_cls={torch.nn.Linear})
        >>> policy(module=torch.nn.Linear(2, 2), recurse=False, nonwrapped_numel=6)
        True
    """
    if recurse:
        return True
    return isinstance(module, _classes(transformer_layer_cls, "transformer_layer_cls"))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: Iterable[type] | None = None,
    exclude_wrap_modules: Iterable[type] | None = None,
) -> bool:
    """Wrap a module once its not-yet-wrapped parameters reach ``min_num_params``.

    Descends into a module only when it holds at least ``min_num_params``
    parameters and is not one of ``force_leaf_modules``; wraps it when its
    remaining parameters (those no wrapped child took) reach
    ``min_num_params`` and it is not one of ``exclude_wrap_modules``.

    Args:
        module: The module asked about.
        recurse: True when the question is "descend into its children?".
        nonwrapped_numel: Parameters of ``module`` not in a wrapped child.
        min_num_params: The size threshold (default 1e8, as in torch).
        force_leaf_modules: Classes never descended into (default
            ``{nn.MultiheadAttention}``, as in torch).
        exclude_wrap_modules: Classes never wrapped (default
            ``{nn.ModuleList, nn.ModuleDict}``: they have no ``forward``).

    Returns:
        Whether to descend (``recurse``) or to wrap ``module``.

    Example:
        >>> import functools, torch
        >>> policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
        >>> policy(module=torch.nn.Linear(16, 16), recurse=False, nonwrapped_numel=272)
        True
    """
    if force_leaf_modules is None:
        force_leaf_modules = vars(size_based_auto_wrap_policy)["FORCE_LEAF_MODULES"]
    if exclude_wrap_modules is None:
        exclude_wrap_modules = vars(size_based_auto_wrap_policy)["EXCLUDE_WRAP_MODULES"]
    is_large = nonwrapped_numel >= min_num_params
    if recurse:
        return is_large and not isinstance(module, _classes(force_leaf_modules, "force_leaf_modules"))
    return is_large and not isinstance(module, _classes(exclude_wrap_modules, "exclude_wrap_modules"))


# The defaults torch's function carries as attributes (and reads from there);
# through vars(), the function's __dict__, as mypy knows no function attributes.
vars(size_based_auto_wrap_policy)["EXCLUDE_WRAP_MODULES"] = {nn.ModuleList, nn.ModuleDict}
vars(size_based_auto_wrap_policy)["FORCE_LEAF_MODULES"] = {nn.MultiheadAttention}


def lambda_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    lambda_fn: Callable[[nn.Module], bool],
) -> bool:
    """Wrap every module for which ``lambda_fn(module)`` is true.

    Example:
        >>> import functools, torch
        >>> policy = functools.partial(lambda_auto_wrap_policy,
        ...                            lambda_fn=lambda m: isinstance(m, torch.nn.Linear))
        >>> policy(module=torch.nn.ReLU(), recurse=False, nonwrapped_numel=0)
        False
    """
    if recurse:
        return True
    return bool(lambda_fn(module))


def recursive_wrap(
    module: nn.Module,
    auto_wrap_policy: Callable[..., bool],
    wrapper_cls: Callable[..., nn.Module],
    ignored_modules: Iterable[nn.Module] = (),
    ignored_params: Iterable[torch.Tensor] = (),
    only_wrap_children: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, int]:
    """Wrap ``module``'s subtree bottom-up where ``auto_wrap_policy`` says so.

    Children are replaced in place (``setattr`` on their parent) by
    ``wrapper_cls(child, **kwargs)``. The algorithm is torch's and
    PyTorch/XLA's ``_recursive_wrap``.

    Args:
        module: The root of the subtree.
        auto_wrap_policy: ``policy(module=, recurse=, nonwrapped_numel=) -> bool``.
        wrapper_cls: Called as ``wrapper_cls(module, **kwargs)``; returns the
            module to put in its place.
        ignored_modules: Modules neither descended into nor wrapped.
        ignored_params: Parameters not counted in ``nonwrapped_numel``.
        only_wrap_children: Never wrap ``module`` itself (the caller wraps it).
        **kwargs: Passed on to ``wrapper_cls``.

    Returns:
        ``(module or its wrapper, number of parameters now inside wrappers)``.

    Example:
        >>> import functools, torch
        >>> seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> policy = functools.partial(transformer_auto_wrap_policy,
        ...                            transformer_layer_cls={torch.nn.Linear})
        >>> _ = recursive_wrap(seq, policy, lambda m: torch.nn.Sequential(m),
        ...                    only_wrap_children=True)
        >>> type(seq[0]).__name__
        'Sequential'
    """
    what = "recursive_wrap"
    _checks.check_instance(module, torch.nn.Module, what, "module", ArgumentTypeError, "an nn.Module")
    _checks.check_callable(auto_wrap_policy, what, "auto_wrap_policy", ArgumentTypeError)
    _checks.check_callable(wrapper_cls, what, "wrapper_cls", ArgumentTypeError)
    only_wrap_children = _checks.check_bool(only_wrap_children, what, "only_wrap_children", ArgumentTypeError)
    ignored_modules = _iterable_of(ignored_modules, torch.nn.Module, "ignored_modules")
    ignored_params = _iterable_of(ignored_params, torch.Tensor, "ignored_params")
    wrapped, n = _wrap_tree(
        module,
        auto_wrap_policy,
        wrapper_cls,
        set(ignored_modules),
        {id(p) for p in ignored_params},
        only_wrap_children,
        kwargs,
    )
    return wrapped, n


def _wrap_tree(
    module: nn.Module,
    policy: Callable[..., bool],
    wrapper_cls: Callable[..., nn.Module],
    ignored_modules: set[nn.Module],
    ignored_ids: set[int],
    only_wrap_children: bool,
    kwargs: dict[str, Any],
) -> tuple[nn.Module, int]:
    nonwrapped_numel = sum(p.numel() for p in module.parameters() if id(p) not in ignored_ids)
    if not policy(module=module, recurse=True, nonwrapped_numel=nonwrapped_numel):
        return module, 0
    total_wrapped = 0
    for name, child in module.named_children():
        if child in ignored_modules:
            continue
        wrapped, n = _wrap_tree(child, policy, wrapper_cls, ignored_modules, ignored_ids, False, kwargs)
        if wrapped is not child:
            setattr(module, name, wrapped)
        total_wrapped += n
    remainder = nonwrapped_numel - total_wrapped
    if not only_wrap_children and policy(module=module, recurse=False, nonwrapped_numel=remainder):
        return wrapper_cls(module, **kwargs), nonwrapped_numel
    return module, total_wrapped
