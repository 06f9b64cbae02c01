"""Room (``libs/core/rooms.py``): the index holds every node whose bound may reach a size."""

from __future__ import annotations

import math
import random

from libs.core.rooms import WINDOW_S, Room, RoomIndex, bound


def random_rooms(rng: random.Random, start: float) -> tuple[Room, ...]:
    rooms = []
    for _ in range(rng.randint(0, 4)):
        protected_until = rng.choice([-math.inf, start - 10, start + 100, start + 2 * WINDOW_S])
        lossless_until = rng.choice([math.inf, start - 10, start + 100])
        rooms.append((protected_until, rng.randint(1, 4), lossless_until, math.inf))
    return tuple(sorted(rooms))


def test_the_index_holds_every_node_whose_bound_reaches_a_size_in_its_window() -> None:
    rng = random.Random(7)
    start = 1000.0
    index = RoomIndex()
    rooms = {f"n{n}": random_rooms(rng, start) for n in range(20)}
    index.rebuild(rooms, start)
    for _ in range(200):  # nodes' work changes: entries move
        node_id = f"n{rng.randrange(20)}"
        rooms[node_id] = random_rooms(rng, start)
        index.put(node_id, rooms[node_id])
        for now in (start, start + 100, start + WINDOW_S):
            assert index.covers(now)
            for lossless in (True, False):
                for free_work in (True, False):
                    for gpus in range(1, 10):
                        held = set(index.at_least(gpus, lossless=lossless, free_work=free_work))
                        reach = {
                            n
                            for n, r in rooms.items()
                            if bound(r, now, lossless=lossless, free_work=free_work) >= gpus
                        }
                        assert reach <= held
    rebuilt = RoomIndex()
    rebuilt.rebuild(rooms, start)
    assert rebuilt.most == index.most
