"""Orthogonal polynomials of ``torch.special`` (Chebyshev, Hermite, Laguerre, Legendre).

Each follows torch's kernel: the degree ``n`` (a tensor or a number,
truncated to an integer per element) runs a three-term recurrence, with the
same special cases (``n < 0`` gives 0, closed forms at ``|x| == 1`` and, for
large ``n`` inside (-1, 1), the trigonometric form). The recurrence is one
``while_loop`` up to the largest degree in the batch; elements with smaller
degrees stop updating when they reach theirs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from spmdtorch.ops._util import Array, Scalar, upcast
from spmdtorch.ops.registry import register

# The recurrences' pieces: q1(x), and a closed form (x, n, n as a float) -> value.
_Unary = Callable[[Array], Array]
_Trig = Callable[[Array, Array, Array], Array]


def _operands(x: Scalar, n: Scalar) -> tuple[Array, Array]:
    x = upcast(x)
    n = jnp.trunc(jnp.asarray(n)).astype(jnp.int32)
    x, n = jnp.broadcast_arrays(x, n)
    return x, n


def _recurrence(x: Array, n: Array, q1: Array, step: Callable[[Array, Array, Array], Array]) -> Array:
    """``p, q = 1, q1``; for j = 1 .. n-1: ``p, q = q, step(j, p, q)``; returns q."""
    nmax = jnp.max(n) if n.size else jnp.int32(0)

    def body(carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        j, p, q = carry
        r = step(j.astype(x.dtype), p, q)
        active = j < n
        return j + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    _, _, q = lax.while_loop(lambda c: c[0] < nmax, body, (jnp.int32(1), jnp.ones_like(x), q1))
    return q


def _finish(x: Array, n: Array, rec: Array, q1: Array, *cases: tuple[Array, Array]) -> Array:
    """n < 0 → 0, n == 0 → 1, n == 1 → q1, then (mask, value) overrides in order."""
    out = jnp.where(n == 1, q1, rec)
    out = jnp.where(n == 0, 1.0, out)
    for mask, value in reversed(cases):
        out = jnp.where(mask, value, out)
    return jnp.where(n < 0, 0.0, out)


def _chebyshev(q1_of: _Unary, edge: _Trig, trig: _Trig, trig_from: int) -> Callable[[Scalar, Scalar], Array]:
    def lower(x: Scalar, n: Scalar) -> Array:
        x, n = _operands(x, n)
        q1 = q1_of(x)
        rec = _recurrence(x, n, q1, lambda j, p, q: (x + x) * q - p)
        nf = n.astype(x.dtype)
        return _finish(
            x, n, rec, q1, (jnp.abs(x) == 1, edge(x, n, nf)), ((n > trig_from) & (jnp.abs(x) < 1), trig(x, n, nf))
        )

    return lower


def _even(n: Array) -> Array:
    return n % 2 == 0


def _t_trig(x: Array, n: Array, nf: Array) -> Array:
    return jnp.cos(nf * jnp.arccos(x))


def _u_trig(x: Array, n: Array, nf: Array) -> Array:
    a = jnp.arccos(x)
    s = jnp.sin(a)
    return jnp.where(s != 0, jnp.sin((nf + 1) * a) / jnp.where(s != 0, s, 1), (nf + 1) * jnp.cos((nf + 1) * a) / x)


def _v_trig(x: Array, n: Array, nf: Array) -> Array:
    a = jnp.arccos(x)
    return jnp.where(
        jnp.sin(a / 2) != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), jnp.where(_even(n), 2 * nf + 1, -(2 * nf + 1))
    )


def _w_trig(x: Array, n: Array, nf: Array) -> Array:
    a = jnp.arccos(x)
    c = jnp.cos(a / 2)
    return jnp.where(
        c != 1,
        jnp.sin((nf + 0.5) * a) / jnp.where(c != 1, jnp.sin(a / 2), 1),
        jnp.where(x > 0, 2 * nf + 1, jnp.where(_even(n), 1.0, -1.0)),
    )


_CHEBYSHEV: dict[str, tuple[_Unary, _Trig, _Trig, int]] = {
    "t": (lambda x: x, lambda x, n, nf: jnp.where((x > 0) | _even(n), 1.0, -1.0), _t_trig, 6),
    "u": (lambda x: x + x, lambda x, n, nf: jnp.where((x > 0) | _even(n), nf + 1, -(nf + 1)), _u_trig, 8),
    "v": (
        lambda x: x + x - 1,
        lambda x, n, nf: jnp.where(x > 0, 1.0, jnp.where(_even(n), 2 * nf + 1, -(2 * nf + 1))),
        _v_trig,
        8,
    ),
    "w": (
        lambda x: x + x + 1,
        lambda x, n, nf: jnp.where(x > 0, 2 * nf + 1, jnp.where(_even(n), 1.0, -1.0)),
        _w_trig,
        8,
    ),
}
for _k, (_q1, _edge, _trig, _from) in _CHEBYSHEV.items():
    _name = f"special_chebyshev_polynomial_{_k}"
    register(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(_chebyshev(_q1, _edge, _trig, _from))


def _simple(
    q1_of: _Unary,
    step: Callable[[Array, Array, Array, Array], Array],
    zero_x_is_one: bool = False,
    edge: Callable[[Array, Array], Array] | None = None,
) -> Callable[[Scalar, Scalar], Array]:
    def lower(x: Scalar, n: Scalar) -> Array:
        x, n = _operands(x, n)
        q1 = q1_of(x)
        rec = _recurrence(x, n, q1, lambda j, p, q: step(x, j, p, q))
        cases: list[tuple[Array, Array]] = []
        if edge is not None:
            cases.append((jnp.abs(x) == 1, edge(x, n)))
        out = _finish(x, n, rec, q1, *cases)
        if zero_x_is_one:
            out = jnp.where((n >= 0) & (x == 0), 1.0, out)
        return out

    return lower


for _name, _lower in {
    # H: torch's loop runs k = 2, 4, ..., i.e. 2j for j = 1 .. n-1
    "special_hermite_polynomial_h": _simple(lambda x: x + x, lambda x, j, p, q: (x + x) * q - 2 * j * p),
    "special_hermite_polynomial_he": _simple(lambda x: x, lambda x, j, p, q: x * q - j * p),
    "special_laguerre_polynomial_l": _simple(
        lambda x: 1 - x, lambda x, j, p, q: ((2 * j + (1 - x)) * q - j * p) / (j + 1), zero_x_is_one=True
    ),
    "special_legendre_polynomial_p": _simple(
        lambda x: x,
        lambda x, j, p, q: ((2 * j + 1) * x * q - j * p) / (j + 1),
        edge=lambda x, n: jnp.where((x > 0) | _even(n), 1.0, -1.0),
    ),
}.items():
    register(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(_lower)


# Shifted Chebyshev polynomials are the plain ones at 2x - 1; torch's special
# cases at x == 1 and x == 0 are exactly |2x - 1| == 1, so they carry over.
for _k, (_q1, _edge, _trig, _from) in _CHEBYSHEV.items():
    _plain = _chebyshev(_q1, _edge, _trig, _from)
    _name = f"special_shifted_chebyshev_polynomial_{_k}"
    register(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(
        lambda x, n, _plain=_plain: _plain(upcast(x) * 2 - 1, n)
    )


# -- special functions JAX has -------------------------------------------------------


@register("igamma.default")
def _igamma(self: Array, other: Array) -> Array:
    return jax.scipy.special.gammainc(upcast(self), upcast(other))


@register("igammac.default")
def _igammac(self: Array, other: Array) -> Array:
    return jax.scipy.special.gammaincc(upcast(self), upcast(other))


@register("special_modified_bessel_i0.default")
def _bessel_i0(self: Array) -> Array:
    return jax.scipy.special.i0(upcast(self))


@register("special_modified_bessel_i1.default")
def _bessel_i1(self: Array) -> Array:
    return jax.scipy.special.i1(upcast(self))


@register("special_spherical_bessel_j0.default")
def _spherical_bessel_j0(x: Array) -> Array:
    x = upcast(x)
    safe = jnp.where(x == 0, 1.0, x)
    return jnp.where(x == 0, 1.0, jnp.sin(safe) / safe)
