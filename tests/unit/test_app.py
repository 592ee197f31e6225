"""Apps: registration of models and handlers, check() and load_app()."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.app import App, Context, is_coroutine_fn, load_app
from gpuq.errors import AppError, GpuqError, InvalidTask


def build() -> App:
    app = App("demo")

    @app.model("llama3-8b", vram_gb=16)
    def load_llama(name: str) -> str:
        return f"loaded {name}"

    @app.handler("llm.generate", model="llama3-8b")
    def generate(model: str, payload: dict[str, str], ctx: Context) -> dict[str, str]:
        return {"text": f"{model}: {payload['prompt']}"}

    @app.handler("any.echo")
    def echo(model: str, payload: object, ctx: Context) -> object:
        return payload

    return app


def test_registration() -> None:
    app = build()
    assert set(app.models) == {"llama3-8b"}
    assert set(app.handlers) == {"llm.generate", "any.echo"}
    spec = app.model_spec("llama3-8b")
    assert spec is not None and spec.vram_gb == 16 and spec.footprint(40) == 16
    assert spec.load("llama3-8b") == "loaded llama3-8b"
    assert app.handlers["llm.generate"].model == "llama3-8b"
    assert app.handlers["any.echo"].model is None
    ctx = Context("t1", 1, "w1", "llama3-8b", 16, 0.1)
    assert app.handlers["llm.generate"].fn("m", {"prompt": "hi"}, ctx) == {"text": "m: hi"}


def test_decorators_return_the_function() -> None:
    app = App("x")

    def loader(name: str) -> str:
        return name

    assert app.model("m")(loader) is loader
    assert app.any_model()(loader) is loader

    def handler(model: object, payload: object, ctx: Context) -> None:
        return None

    assert app.handler("h")(handler) is handler


def test_async_handlers_are_told_apart_at_registration() -> None:
    """``async def`` runs on the worker's event loop: a partial of one and an object whose
    ``__call__`` is one count; a plain function or a class does not."""
    async def chat(model: object, payload: object, ctx: Context) -> object:
        return payload

    def plain(model: object, payload: object, ctx: Context) -> object:
        return payload

    class Engine:
        async def __call__(self, model: object, payload: object, ctx: Context) -> object:
            return payload

    app = App("x")
    app.handler("chat")(chat)
    app.handler("plain")(plain)
    app.handler("batched", batch=4)(chat)
    assert app.handlers["chat"].is_async and app.handlers["batched"].is_async
    assert not app.handlers["plain"].is_async
    assert is_coroutine_fn(functools.partial(chat, None)) and is_coroutine_fn(Engine())
    assert not is_coroutine_fn(Engine) and not is_coroutine_fn(plain) and not is_coroutine_fn(None)


def test_fallback_loader_serves_any_name_with_task_footprint() -> None:
    app = App("sim")
    app.any_model()(lambda name: name.upper())
    spec = app.model_spec("whatever-13b")
    assert spec is not None
    assert spec.name == "whatever-13b" and spec.vram_gb is None
    assert spec.footprint(26.5) == 26.5
    assert spec.load("whatever-13b") == "WHATEVER-13B"


def test_named_model_wins_over_fallback() -> None:
    app = build()
    app.any_model()(lambda name: "fallback")
    spec = app.model_spec("llama3-8b")
    assert spec is not None and spec.vram_gb == 16


def test_check_accepts_a_runnable_task() -> None:
    app = build()
    assert app.check("llm.generate", "llama3-8b") is None
    assert app.check("any.echo", "llama3-8b") is None


def test_check_unknown_handler() -> None:
    assert build().check("llm.nope", "llama3-8b") == "handler 'llm.nope' is not registered in app 'demo'"


def test_check_handler_bound_to_another_model() -> None:
    msg = build().check("llm.generate", "mistral-7b")
    assert msg == "handler 'llm.generate' runs model 'llama3-8b', task names 'mistral-7b'"


def test_check_model_without_loader() -> None:
    msg = build().check("any.echo", "mistral-7b")
    assert msg == "model 'mistral-7b' has no loader in app 'demo'"


def test_check_fallback_makes_every_model_loadable() -> None:
    app = build()
    app.any_model()(lambda name: name)
    assert app.check("any.echo", "mistral-7b") is None


@pytest.fixture
def fake_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("gpuq_test_fake_app")
    module.app = build()  # type: ignore[attr-defined]
    module.not_an_app = {"handlers": {}}  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_load_app(fake_module: types.ModuleType) -> None:
    assert load_app("gpuq_test_fake_app:app") is fake_module.app


def test_load_app_ships_the_sim_app() -> None:
    app = load_app("workers.sim:app")
    assert isinstance(app, App)
    assert {"sim.run", "sim.noop", "sim.fail"} <= set(app.handlers)


@pytest.mark.parametrize("path", ["workers.sim", "workers.sim:", ":app", "", ":"])
def test_load_app_malformed_path(path: str) -> None:
    with pytest.raises(AppError, match="must look like module:attr") as info:
        load_app(path)
    assert isinstance(info.value, GpuqError)


def test_load_app_import_error() -> None:
    with pytest.raises(AppError, match="cannot import app module 'no_such_module_gpuq'"):
        load_app("no_such_module_gpuq:app")


def test_load_app_whose_module_raises_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect: an app module that raised anything but ImportError at import ended the
    worker in a 40-line traceback."""
    (tmp_path / "gpuq_test_raising_app.py").write_text("import gpuq\nraise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppError, match=r"cannot import app module 'gpuq_test_raising_app': "
                                       r"RuntimeError: boom at import \(.*gpuq_test_raising_app.py:2\)"):
        load_app("gpuq_test_raising_app:app")


def test_load_app_missing_attribute(fake_module: types.ModuleType) -> None:
    with pytest.raises(AppError, match=r"app module 'gpuq_test_fake_app' has no 'missing'"):
        load_app("gpuq_test_fake_app:missing")


def test_load_app_not_an_app(fake_module: types.ModuleType) -> None:
    with pytest.raises(AppError, match=r"gpuq_test_fake_app:not_an_app is not a gpuq.App"):
        load_app("gpuq_test_fake_app:not_an_app")


def test_registrations_that_could_only_fail_at_run_time_are_refused_at_start(
        fake_module: types.ModuleType) -> None:
    """Regression: a second registration of a name replaced the first; a handler or loader
    taking other arguments than the worker passes failed every attempt of every task; a
    handler naming a model with no loader was published, and its tasks failed when run."""
    app = App("twice")

    @app.handler("h")
    def one(model: object, payload: object, ctx: object) -> None:
        return None

    with pytest.raises(AppError, match="handler 'h' is registered twice in app 'twice'"):
        app.handler("h")(one)
    app.model("m")(lambda name: name)
    with pytest.raises(AppError, match="model 'm' is registered twice"):
        app.model("m")(lambda name: name)
    with pytest.raises(AppError, match=r"handler 'two' must take \(model, payload, ctx\) by position, "
                                       r"got two\(model, payload\)$"):
        @app.handler("two")
        def two(model: object, payload: object) -> None:
            return None
    # found by a handler author: the keyword-only ctx showed as (model, payload, ctx), what was asked
    with pytest.raises(AppError, match=r"got <lambda>\(model, payload, \*, ctx\)"):
        app.handler("kw")(lambda model, payload, *, ctx: 1)
    with pytest.raises(AppError, match=r"handler 'b' must take \(model, payloads, ctx\)"):
        app.handler("b", batch=4)(lambda model, payloads: None)
    with pytest.raises(AppError, match=r"model 'n': the loader must take \(name\)"):
        app.model("n")(lambda: None)
    app.handler("flexible")(lambda *args, **kwargs: None)  # takes what it is given
    fake_module.ghost = App("ghost")
    fake_module.ghost.handler("g", model="nowhere")(lambda model, payload, ctx: None)
    with pytest.raises(AppError, match=r"handler 'g' runs model 'nowhere', which has no loader "
                                       r"in app 'ghost'"):
        load_app("gpuq_test_fake_app:ghost")
    fake_module.ghost.any_model()(lambda name: name)  # any model: the handler's too
    assert load_app("gpuq_test_fake_app:ghost") is fake_module.ghost


def test_a_checkpoint_past_the_limit_is_refused_where_it_is_saved() -> None:
    """Regression: a checkpoint over 1 MiB was kept, then the server refused the yield's
    requeue: the task sat running without a handler until its lease ran out."""
    from gpuq.app import Context
    from gpuq.errors import InvalidTask

    ctx = Context("t", 1, "w", "m", 1.0, 1.0)
    with pytest.raises(InvalidTask, match="checkpoint of 2097154 bytes is more than the 1048576"):
        ctx.save_checkpoint("x" * (2 << 20))
    ctx.save_checkpoint({"i": 1})


@pytest.mark.parametrize("state", [{1, 2}, float("nan"), b"x", {"deep": {"set": {1}}}])
def test_a_checkpoint_that_is_not_json_is_invalid_task(state: object) -> None:
    """Regression: save_checkpoint (and yield_now) of a value JSON cannot encode raised the
    encoder's bare TypeError or ValueError, unlike emit's EmitError; the last good one stays."""
    ctx = Context("t", 1, "w", "m", 1.0, 1.0)
    ctx.save_checkpoint({"i": 1})
    with pytest.raises(InvalidTask, match="checkpoint"):
        ctx.save_checkpoint(state)
    with pytest.raises(InvalidTask, match="checkpoint"):
        ctx.yield_now(state)
    assert ctx.saved == '{"i":1}'


def test_an_async_handler_behind_a_plain_decorator_is_awaited() -> None:
    """Regression: a functools.wraps wrapper hides async def from inspect: the worker called
    it, got a coroutine back, and failed the task (result not JSON) without awaiting it."""
    import functools

    from gpuq.testing import drain, memory_queue

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args)
        return wrapper

    app = App("t")
    app.model("m", vram_gb=1)(lambda name: name)

    @app.handler("h", model="m")
    @logged
    async def handler(model: Any, payload: Any, ctx: Any) -> Any:
        return {"ok": payload}

    q = memory_queue()
    task = q.enqueue("h", 7, model="m", vram_gb=2)
    assert drain(q, app) == 1
    assert task.result(timeout=1) == {"ok": 7}


@pytest.mark.parametrize("register, match", [
    (lambda app: app.model("m", vram_gb=-5), r"model 'm': vram_gb must be a (finite )?number"),
    (lambda app: app.model("m", vram_gb="16"), r"model 'm': vram_gb must be a (finite )?number"),
    (lambda app: app.model("m", vram_gb=float("nan")), r"model 'm': vram_gb must be a (finite )?number"),
    (lambda app: app.model("a b", vram_gb=1), r"model name 'a b' holds spaces"),
    (lambda app: app.handler("a b"), r"handler name 'a b' holds spaces"),
    (lambda app: app.handler(""), r"handler name must be a non-empty string"),
    (lambda app: app.handler("h", model="{m}"), r"handler 'h': model name '\{m\}' holds"),
    (lambda app: app.model("m", vram_gb=1, unload=5), r"model 'm': unload must be a function"),
])
def test_a_bad_registration_is_refused_where_it_is_made(register: Any, match: str) -> None:
    """Regression: App.model took any vram_gb: a str failed every claim of the worker with a
    TypeError from its ledger, a negative one with the claim's 'free and evictable GB ...
    must be numbers in range'; a handler name no task can spell was registered silently."""
    with pytest.raises(AppError, match=match):
        register(App("a"))(lambda *args: None)


@pytest.mark.parametrize("register", [
    lambda app: app.model("m", vram_gb=1), lambda app: app.any_model(), lambda app: app.handler("h"),
])
def test_a_registered_loader_or_handler_must_be_callable(register: Any) -> None:
    with pytest.raises(AppError, match="must be a function, got None"):
        register(App("a"))(None)


def test_a_handler_s_timeout_is_kept_as_seconds_or_none() -> None:
    app = App("a")
    app.handler("bounded", timeout_s=30)(lambda *args: None)
    app.handler("fine", batch=4, timeout_s=0.25)(lambda *args: None)
    app.handler("open")(lambda *args: None)
    timeouts = {name: spec.timeout_s for name, spec in app.handlers.items()}
    assert timeouts == {"bounded": 30.0, "fine": 0.25, "open": None}
    assert isinstance(app.handlers["bounded"].timeout_s, float)


@pytest.mark.parametrize("timeout_s", [-1, 0, 0.0, float("nan"), float("inf"), "30", True, [30]])
def test_a_bad_timeout_is_refused_at_registration_in_one_line(timeout_s: object) -> None:
    """A handler's run bound must be a number of seconds > 0: zero, a negative number or NaN
    would stop every run at once (or never), a string would fail in the worker's clock."""
    with pytest.raises(AppError) as err:
        App("a").handler("h", timeout_s=timeout_s)  # type: ignore[arg-type]
    message = str(err.value)
    assert message == f"handler 'h': timeout_s must be a number of seconds > 0 (or None), got {timeout_s!r}"
    assert "\n" not in message
