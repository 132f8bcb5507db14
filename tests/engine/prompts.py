"""Prompts for the parity tests: lengths from 1 token to over 800, shared prefixes, chat templates."""

from __future__ import annotations

SYSTEM = (
    "You are a meticulous assistant for a railway company. You answer questions about timetables, "
    "ticket prices, luggage rules and accessibility. Always be precise, cite the rule you rely on, and "
    "say when you do not know. "
)

STORY = (
    "Once upon a time, in a valley surrounded by tall mountains, there lived a clockmaker named Elena. "
    "Every morning she opened her small shop, wound the hundred clocks on her walls, and listened to them "
    "tick in unison. Travelers came from far away to buy her clocks, because they never lost a second. "
)


def long_text(repeats: int) -> str:
    return "".join(f"Chapter {i}. " + STORY for i in range(repeats))
