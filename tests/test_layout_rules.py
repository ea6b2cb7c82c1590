"""Layout options that would be accepted and ignored, or priced wrongly, are refused."""

from __future__ import annotations

import pytest

from trainplan.errors import LayoutError
from trainplan.layout import Layout


def test_a_schedule_without_a_pipeline_is_refused() -> None:
    for schedule in ("interleaved", "zb"):
        with pytest.raises(LayoutError, match="needs pp > 1") as err:
            Layout(pp=1, pp_schedule=schedule)  # type: ignore[arg-type]
        assert err.value.field == "pp_schedule"
    Layout(pp=1)  # the default schedule is fine


def test_interleaved_needs_two_or_more_virtual_stages() -> None:
    """Interleaved with v = 1 would be timed as 1F1B yet charged the interleaved peak."""
    with pytest.raises(LayoutError, match="virtual-stages 2") as err:
        Layout(pp=4, pp_schedule="interleaved")
    assert err.value.field == "virtual_stages"
    Layout(pp=4, pp_schedule="interleaved", virtual_stages=2)


def test_context_parallel_needs_two_chunks_per_rank() -> None:
    """Causal load balancing gives each cp rank two of 2·cp chunks: 2·cp must divide the sequence."""
    with pytest.raises(LayoutError, match="2·cp = 8") as err:
        Layout(dp=1, cp=4).check_batch(seq_len=4100, micro_batch=1, global_batch=None)
    assert err.value.field == "cp"
    assert Layout(dp=1, cp=4).check_batch(seq_len=4096, micro_batch=1, global_batch=None) == 1
