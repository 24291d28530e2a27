"""What the ported examples share: inputs drawn from a seed (never from pnex)."""

from __future__ import annotations

import torch


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def integer_matrices(device: str, seed: int, m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 matrices of small integers: their products sum exactly in float32."""
    gen = generator(seed)
    a = torch.randint(-4, 5, (m, k), generator=gen).float()
    b = torch.randint(-4, 5, (k, n), generator=gen).float()
    return a.to(device), b.to(device)
