"""Users' code type-checks against gpuq's hints (py.typed) under mypy --strict."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]


def _mypy(tmp_path: Path, source: str) -> tuple[int, str]:
    path = tmp_path / "user_app.py"
    path.write_text(textwrap.dedent(source))
    env_path = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = str(ROOT)
    try:
        out, err, rc = mypy_api.run(["--strict", "--no-incremental", "--cache-dir", os.devnull,
                                     "--config-file", os.devnull, str(path)])
    finally:
        if env_path is None:
            del os.environ["MYPYPATH"]
        else:
            os.environ["MYPYPATH"] = env_path
    return rc, out + err


@pytest.mark.slow
def test_handlers_with_any_parameter_names_type_check(tmp_path: Path) -> None:
    # README's async sample names its first parameter `engine`; a batch handler's second
    # is often not `payloads`: the decorator must take them, and keep the function's type
    rc, out = _mypy(tmp_path, """
        from typing import Any
        import gpuq
        from gpuq.app import BatchContext

        app = gpuq.App("x")

        @app.handler("llm.chat", model="llama3-8b")
        async def chat(engine: Any, payload: Any, ctx: gpuq.Context) -> dict[str, str]:
            return {"text": str(await engine.generate(payload["prompt"]))}

        @app.handler("b")
        def gen(m: Any, p: Any, c: gpuq.Context) -> int:
            return 1

        @app.handler("embed", batch=8)
        def embed(model: Any, items: list[Any], ctx: BatchContext) -> list[Any]:
            return items

        n: int = gen(None, None, gpuq.Context("t", 1, "w", "m", 1.0, 1.0))
    """)
    assert rc == 0, out


@pytest.mark.slow
def test_a_handler_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    rc, out = _mypy(tmp_path, """
        from typing import Any
        import gpuq

        app = gpuq.App("x")

        @app.handler("a")
        def bad(model: Any, payload: Any) -> int:
            return 1
    """)
    assert rc == 1 and "type-var" in out, out
