"""A keyed 64-bit hash over numpy arrays, and the keyed permutation built on it: the train/validation split
and the training windows' order use them.

SplitMix64's finaliser (Steele et al. 2014, the mixer of java.util.SplittableRandom): a bijection on 64-bit
integers whose output bits each depend on every input bit, fast on whole arrays, and the same on every
machine and numpy version (no random generator state involved).
"""

from __future__ import annotations

import numpy as np

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * _C1  # uint64 arithmetic wraps modulo 2**64, as intended
    x = (x ^ (x >> np.uint64(27))) * _C2
    return x ^ (x >> np.uint64(31))


def hash64(key: int, values: np.ndarray) -> np.ndarray:
    """hash(key, v) for each v: independent-looking 64-bit values for each key."""
    k = mix64((np.array([key % 2**64], dtype=np.uint64) + np.uint64(1)) * _GOLDEN)  # key 0 -> nonzero
    return mix64(np.asarray(values, dtype=np.uint64) ^ k)


def unit_interval(key: int, values: np.ndarray) -> np.ndarray:
    """hash(key, v) as a float in [0, 1), from the top 53 bits (a double's precision)."""
    return (hash64(key, values) >> np.uint64(11)).astype(np.float64) * 2.0**-53


class FeistelPermutation:
    """A keyed bijection of [0, size), evaluated per position: O(1) memory for any size.

    A balanced Feistel network on the smallest even number of bits covering size (a bijection of that
    power-of-two range for any round function), restricted to [0, size) by cycle walking: a value landing
    outside is encrypted again until it lands inside (Black & Rogaway 2002). The range is < 4 x size, so a
    position takes < 4 encryptions on average.
    """

    ROUNDS = 6

    def __init__(self, size: int, seed: int, epoch: int):
        bits = max(2, (size - 1).bit_length())
        bits += bits % 2
        self.size = size
        self.half, self.mask = np.uint64(bits // 2), np.uint64((1 << bits // 2) - 1)
        self.round_keys = hash64(seed, epoch * self.ROUNDS + np.arange(self.ROUNDS))

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = self._encrypt(np.asarray(positions, dtype=np.uint64))
        outside = x >= self.size
        while outside.any():
            x[outside] = self._encrypt(x[outside])
            outside = x >= self.size
        return x.astype(np.int64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.round_keys:
            left, right = right, left ^ (mix64(right ^ key) & self.mask)
        return (left << self.half) | right
