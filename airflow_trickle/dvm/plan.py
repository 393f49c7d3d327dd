"""Placeholder replaced by the operator-tree planner."""


def unsupported_constructs(defining_query: str) -> list[str]:
    return []
