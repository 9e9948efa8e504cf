"""Hadamard matrices of the sizes models have, and the seeded randomized rotation made of
one (QuaRot's rotation without learned matrices).

A Hadamard matrix H of order n has entries +-1 and H H^T = n I, so H / sqrt(n) is
orthogonal. Orders 2^k come from Sylvester's doubling; the others models need (576 =
36 * 16, 640 = 20 * 32, 896 = 28 * 32, 1536 = 12 * 128, 3584 = 28 * 128) from Paley's
constructions on a prime q, doubled: order q + 1 when q = 3 mod 4 (Paley I) and 2 (q + 1)
when q = 1 mod 4 (Paley II). An order none of these reach is refused, never padded.
"""

from __future__ import annotations

import torch

from qcal.errors import ConfigError


def _is_prime(q: int) -> bool:
    return q >= 2 and all(q % d for d in range(2, int(q**0.5) + 1))


def _legendre(a: int, q: int) -> int:
    a %= q
    if a == 0:
        return 0
    return 1 if pow(a, (q - 1) // 2, q) == 1 else -1


def _jacobsthal(q: int) -> torch.Tensor:
    idx = torch.arange(q)
    table = torch.tensor([_legendre(d, q) for d in range(q)], dtype=torch.float64)
    return table[(idx[None, :] - idx[:, None]) % q]


def _paley(m: int) -> torch.Tensor | None:
    """A Hadamard matrix of order m from Paley's constructions, or None."""
    q = m - 1
    if _is_prime(q) and q % 4 == 3:  # Paley I: I + [[0, 1^T], [-1, Q]]
        s = torch.zeros(m, m, dtype=torch.float64)
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
        return s + torch.eye(m, dtype=torch.float64)
    q = m // 2 - 1
    if m % 2 == 0 and _is_prime(q) and q % 4 == 1:  # Paley II on C = [[0, 1^T], [1, Q]]
        c = torch.zeros(q + 1, q + 1, dtype=torch.float64)
        c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
        zero = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
        unit = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
        return torch.kron(c, unit) + torch.kron(torch.eye(q + 1, dtype=torch.float64), zero)
    return None


def hadamard(n: int) -> torch.Tensor:
    """A Hadamard matrix of order `n` (float64, entries +-1); ConfigError when none of the
    constructions here reaches n."""
    if n < 1:
        raise ConfigError(f"a Hadamard matrix needs a positive order, not {n}")
    power, base = 1, None
    while n % power == 0:
        m = n // power
        base = torch.ones(1, 1, dtype=torch.float64) if m == 1 else _paley(m)
        if base is not None:
            break
        power *= 2
    if base is None:
        raise ConfigError(f"no Hadamard matrix of order {n} is built here (orders 2^k, and "
                          "2^k (q + 1) or 2^k * 2 (q + 1) for a prime q); --rotate hadamard "
                          f"cannot rotate a hidden size of {n}")
    h = base
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_hadamard(n: int, seed: int) -> torch.Tensor:
    """The orthogonal float64 matrix H diag(s) / sqrt(n), with signs s drawn from `seed`:
    a different rotation per seed, each spreading every channel over all of them."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n,), generator=gen).to(torch.float64).mul_(2).sub_(1)
    return hadamard(n).mul_(signs).div_(n**0.5)
