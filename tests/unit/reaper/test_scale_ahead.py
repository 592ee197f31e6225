"""gpuq.reaper.scale_ahead: the forecast's warm hints and its check on new workers (no Redis)."""

from __future__ import annotations

from gpuq.config import Config
from gpuq.reaper.forecast import Forecast
from gpuq.reaper.scale_ahead import ahead_hints, drained, held_by

NOW = 1_700_000_000_000
CFG = Config(forecast_window_s=1000.0)
GB = {"hot": 20.0, "warm": 20.0, "cold": 20.0, "big": 60.0}


def fc(model: str, per_s: float) -> Forecast:
    return Forecast(model, per_s, per_s, 60.0, per_s, None)


def hints(spare: list[tuple[str, float]], holders: dict[str, set[str]], rates: dict[str, float],
          recent: dict[str, int] | None = None, used: set[str] | None = None,
          gpus: dict[str, int] | None = None, need_gpus: dict[str, int] | None = None
          ) -> list[tuple[str, str, float]]:
    return ahead_hints([(w, gb, (gpus or {}).get(w, 1)) for w, gb in spare], holders,
                       {m: fc(m, r) for m, r in rates.items()}, GB, CFG, NOW,
                       recent or {}, 30_000, set() if used is None else used, need_gpus=need_gpus)


def test_the_most_expected_model_no_idle_worker_holds_goes_to_free_room_first() -> None:
    # w1 holds three models (no room); w2 is empty: hot goes there, without evicting
    got = hints([("w1", 75.0), ("w2", 75.0)], {"warm": {"w1"}, "cold": {"w1"}, "big": set()},
                {"hot": 0.01, "warm": 0.004, "cold": 0.0})
    assert got == [("w2", "hot", 20.0)]


def test_a_model_an_idle_worker_holds_is_not_hinted() -> None:
    assert hints([("w1", 75.0)], {"hot": {"w1"}}, {"hot": 0.01}) == []
    # a busy holder (not in spare) does not keep its next task warm: an idle worker loads it
    assert hints([("w1", 75.0)], {"hot": {"busy"}}, {"hot": 0.01}) == [("w1", "hot", 20.0)]


def test_a_full_worker_displaces_only_models_nobody_asks_for() -> None:
    full = {"warm": {"w1"}, "cold": {"w1"}, "big": {"w1"}}  # 100 GB of footprints: no room
    assert hints([("w1", 75.0)], full, {"hot": 0.01}) == [("w1", "hot", 20.0)]
    assert hints([("w1", 75.0)], full, {"hot": 0.01, "cold": 0.0}) == [("w1", "hot", 20.0)]
    assert hints([("w1", 75.0)], full, {"hot": 0.01, "warm": 0.0001}) == []


def test_room_goes_first_then_the_worker_whose_models_are_asked_for_least() -> None:
    holders = {"warm": {"w1"}, "cold": {"w2"}}
    got = hints([("w1", 75.0), ("w2", 75.0)], holders, {"hot": 0.01, "warm": 0.004, "cold": 0.002})
    assert got == [("w2", "hot", 20.0)]


def test_fewer_than_one_task_a_window_is_not_worth_a_load() -> None:
    assert hints([("w1", 75.0)], {}, {"hot": 0.0009}) == []
    assert hints([("w1", 75.0)], {}, {"hot": 0.001}) == [("w1", "hot", 20.0)]


def test_each_worker_takes_one_hint_a_step_and_a_model_one_per_interval() -> None:
    used: set[str] = set()
    got = hints([("w1", 75.0), ("w2", 75.0)], {}, {"hot": 0.02, "warm": 0.01, "cold": 0.005}, used=used)
    assert [m for _, m, _ in got] == ["hot", "warm"] and used == {"w1", "w2"}
    assert hints([("w1", 75.0)], {}, {"hot": 0.02}, recent={"hot": NOW - 10_000}) == []
    assert hints([("w1", 75.0)], {}, {"hot": 0.02}, recent={"hot": NOW - 30_000}) != []
    assert hints([("w1", 75.0)], {}, {"hot": 0.02}, used={"w1"}) == []


def test_a_model_larger_than_the_worker_or_of_unknown_size_is_skipped() -> None:
    assert hints([("w1", 40.0)], {}, {"big": 0.02}) == []
    assert hints([("w1", 75.0)], {}, {"unknown": 0.02}) == []


def test_held_by_inverts_the_holders() -> None:
    assert held_by({"b": {"w1"}, "a": {"w1", "w2"}}) == {"w1": ["a", "b"], "w2": ["a"]}


def test_drained_when_the_live_workers_finish_before_a_new_one_could_start() -> None:
    # 2 live workers, a new one starts in 100 s: 150 s queued + 0.4 GPU-s/s x 100 s <= 200 s
    assert drained(2, 150.0, 0.4, 100.0)
    assert not drained(2, 170.0, 0.4, 100.0)
    assert not drained(0, 1.0, 0.0, 100.0)  # nobody to drain it


def test_a_model_whose_tasks_ask_more_gpus_goes_only_to_a_group_that_has_them() -> None:
    """Found by a QA pass: a one-GPU worker was told to preload a model whose tasks all ask
    four GPUs: weights it could never serve, and a holder that is none."""
    rates = {"big": 0.01}
    assert hints([("w1", 75.0)], {}, rates, need_gpus={"big": 4}) == []
    assert hints([("w1", 75.0), ("g4", 300.0)], {}, rates, gpus={"g4": 4},
                 need_gpus={"big": 4}) == [("g4", "big", 60.0)]
    assert hints([("w1", 75.0)], {}, rates) == [("w1", "big", 60.0)]  # none seen: one GPU


def test_a_one_gpu_model_is_preloaded_on_the_tightest_one_gpu_worker_not_the_first_by_name() -> None:
    """Found by a groups user: the rank fell back on the worker's id, so a 4-GPU group named
    first by its id got a one-GPU model while one-GPU workers idled (spare is tightest first)."""
    spare = [("zz-l4", 75.0), ("mm-a100", 75.0), ("aa-4x", 300.0)]
    got = hints(spare, {}, {"hot": 0.01}, gpus={"aa-4x": 4})
    assert got == [("zz-l4", "hot", 20.0)]
    # a model whose tasks ask 4 GPUs still goes to the group
    assert hints(spare, {}, {"hot": 0.01}, gpus={"aa-4x": 4}, need_gpus={"hot": 4}) == [("aa-4x", "hot", 20.0)]
