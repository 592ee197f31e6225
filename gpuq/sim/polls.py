"""Where a repeated poll falls on the virtual clock, without running it.

A poll every ``step`` seconds is scheduled by one float addition at a time (t + step, then
(t + step) + step, ...), whose roundings a product n x step would not reproduce. Between two
powers of two the doubles are evenly spaced, so there every addition adds the same amount
(step rounded to that spacing) and a run of them is one multiplication, exactly: finding a
poll weeks of polls ahead costs a few steps per power of two crossed.
"""

from __future__ import annotations

import math


def last_before(t: float, step: float, bound: float) -> float:
    """The last of t, t + step, (t + step) + step, ... below ``bound`` (t if t + step is
    not), as one addition at a time computes them; step > 0."""
    while True:
        following = t + step
        if following >= bound:
            return t
        if t > 0:
            _, exp = math.frexp(t)  # t in [2**(exp-1), 2**exp): doubles there are u apart
            top, u = math.ldexp(1.0, exp), math.ldexp(1.0, exp - 53)
            halves = math.ldexp(step, 54 - exp)  # step in units of u/2 (exact)
            added = following - t  # step rounded to a multiple of u, while sums stay below top
            tie = halves == int(halves) and int(halves) % 2 == 1  # would round to even
            if not tie and added > 1e6 * u:  # the run's length is then safely computed
                n = int((min(top - step, bound) - t) / added) - 2
                if n > 0:
                    t += n * added  # a multiple of u below top: exact
                    continue
        t = following
