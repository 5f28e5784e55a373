"""The two FP8 formats, computed from their bit layouts (Micikevicius et al. 2022, "FP8 Formats for Deep
Learning", arXiv:2209.05433, sec. 3 and Table 1).

An FP8 number is 1 sign bit, E exponent bits and M mantissa bits, with exponent bias 2^(E-1) - 1:

- a *normal* number (stored exponent e from 1 up) is (-1)^s 2^(e - bias) (1 + m / 2^M);
- a *subnormal* one (stored exponent 0) is (-1)^s 2^(1 - bias) (m / 2^M): the numbers between 0 and the
  smallest normal, spaced like the smallest binade.

The two encodings differ in what the top exponent means:

- **E5M2** follows IEEE 754: the all-ones exponent holds infinities (mantissa 0) and NaNs, so the largest
  finite number has exponent 2^E - 2 and a full mantissa: 2^15 x 1.75 = 57,344.
- **E4M3** ("fn", finite) gives infinities up and keeps one NaN pattern, S.1111.111; the all-ones exponent
  holds ordinary numbers with mantissas 000-110, so the largest is 2^8 x 1.75 = 448.

E4M3 has one more mantissa bit (relative step 2^-3 = 12.5 % against 25 %) and E5M2 more range (about 32
binades of normals and subnormals against 18). The paper recommends E4M3 for weights and activations
(forward) and E5M2 for gradients, whose magnitudes spread over many more binades. `FORMATS` holds both, and
`decode_all` reads every one of the 256 bit patterns through torch, so that the closed forms can be
checked against `torch.finfo` and against the values torch itself decodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 encoding: `exponent_bits` E, `mantissa_bits` M, and whether the all-ones exponent is kept for
    infinities and NaNs (`ieee_specials`, E5M2) or holds numbers except S.1111.111 (E4M3)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    ieee_specials: bool
    torch_dtype: torch.dtype

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_exponent(self) -> int:
        """The unbiased exponent of the largest binade that holds finite numbers."""
        top = 2**self.exponent_bits - 1
        return (top - 1 if self.ieee_specials else top) - self.bias

    @property
    def max(self) -> float:
        """The largest finite number: a full mantissa in the top binade (E4M3 loses its all-ones mantissa
        to NaN, so it keeps 2^M - 2 there)."""
        top_mantissa = 2**self.mantissa_bits - (1 if self.ieee_specials else 2)
        return 2.0**self.max_exponent * (1 + top_mantissa / 2**self.mantissa_bits)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """The step between 1 and the next number: 2^-M (the relative step of every binade)."""
        return 2.0**-self.mantissa_bits

    @property
    def binades(self) -> float:
        """The dynamic range in powers of two, from the smallest subnormal to the largest number."""
        return math.log2(self.max / self.min_subnormal)

    def step_at(self, x: float) -> float:
        """The spacing of representable numbers around |x| (constant below the smallest normal)."""
        if not 0 < abs(x) <= self.max:
            raise ValueError(f"x={x} is outside (0, {self.max}], the finite range of {self.name}")
        e = max(math.floor(math.log2(abs(x))), 1 - self.bias)
        return 2.0 ** (e - self.mantissa_bits)

    def finite_values(self) -> list[float]:
        """Every finite non-negative number of the format, from its bit layout, in increasing order."""
        out = [m * self.min_subnormal for m in range(2**self.mantissa_bits)]  # 0 and the subnormals
        for e in range(1 - self.bias, self.max_exponent + 1):
            for m in range(2**self.mantissa_bits):
                v = 2.0**e * (1 + m / 2**self.mantissa_bits)
                if v <= self.max:
                    out.append(v)
        return out


E4M3 = Fp8Format("E4M3", 4, 3, False, torch.float8_e4m3fn)
E5M2 = Fp8Format("E5M2", 5, 2, True, torch.float8_e5m2)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def fp8_format(name: str | torch.dtype) -> Fp8Format:
    """The format called `name` ("e4m3", "e5m2") or with torch dtype `name`; a ValueError otherwise."""
    for f in FORMATS.values():
        if name == f.torch_dtype or (isinstance(name, str) and name.lower() == f.name.lower()):
            return f
    raise ValueError(f"format={name!r} is not an FP8 format; choose 'e4m3' (forward) or 'e5m2' (gradients)")


def decode_all(fmt: Fp8Format) -> torch.Tensor:
    """The 256 bit patterns 0x00 .. 0xFF read as `fmt` by torch (float32 values; NaN and inf included)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.torch_dtype).float()


def check_against_torch(fmt: Fp8Format) -> dict[str, bool]:
    """Our closed forms against `torch.finfo` and against every value torch decodes from the 256 patterns."""
    fi = torch.finfo(fmt.torch_dtype)
    values = decode_all(fmt)
    finite = values[torch.isfinite(values)]
    positive = sorted({float(v) for v in finite if v >= 0})
    return {
        "max": fi.max == fmt.max,
        "min normal": fi.smallest_normal == fmt.min_normal,
        "eps": fi.eps == fmt.eps,
        "smallest subnormal": float(finite[finite > 0].min()) == fmt.min_subnormal,
        "all finite values": positive == fmt.finite_values(),
        "specials": int(torch.isinf(values).sum()) == (2 if fmt.ieee_specials else 0)
        and int(torch.isnan(values).sum()) == (2 * (2**fmt.mantissa_bits - 1) if fmt.ieee_specials else 2),
    }
