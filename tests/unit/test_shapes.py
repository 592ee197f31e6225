"""A stored GPU count as the views and the scaler read it (gpuq.shapes.gpus_of)."""

from __future__ import annotations

import pytest

from gpuq import shapes


@pytest.mark.parametrize(("stored", "gpus"), [("2", 2), ("4.0", 4), (None, 1), ("", 1), ("x", 1),
                                              ("0", 1), ("1e9", 64), ("nan", 1), ("inf", 1)])
def test_a_stored_gpu_count_reads_as_one_to_sixty_four(stored: object, gpus: int) -> None:
    """A damaged `classes:gpus` field ("nan") counts as one GPU; int(nan) had stopped the
    scale step's round."""
    assert shapes.gpus_of(stored) == gpus
