"""Output capture per attempt when attempts are asyncio tasks on one thread (a chain try's
`async def` handler): each task's prints land in its own buffer, interleaved or not."""

from __future__ import annotations

import asyncio

from hivejobs.worker.capture import Captured, capturing


async def attempt(name: str, turn: asyncio.Event, next_turn: asyncio.Event) -> Captured:
    with capturing(1024) as out:
        print(f"{name} before")
        next_turn.set()
        await turn.wait()  # the other task prints meanwhile, on this same thread
        print(f"{name} after")
        await asyncio.to_thread(print, f"{name} from its worker thread")
    return out


def test_two_tasks_on_one_loop_capture_only_their_own_output() -> None:
    async def both() -> tuple[Captured, Captured]:
        a_turn, b_turn = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(attempt("a", a_turn, b_turn))
        b = asyncio.create_task(attempt("b", b_turn, a_turn))
        return await a, await b

    a, b = asyncio.run(both())
    assert a.stdout.text() == "a before\na after\na from its worker thread\n"
    assert b.stdout.text() == "b before\nb after\nb from its worker thread\n"
