"""Benchmarks of real CPU runs, the simulator and the planner (python -m vp.bench; docs/benchmarks.md)."""


def best_of_rounds(rounds: list[list[dict]], key: str) -> list[tuple[dict, list[float], float]]:
    """Per item of a round (each round measures the same items in the same order): the round's figures where `key`
    (CPU seconds) was least, every round's `key`, and their spread (most / least)."""
    out = []
    for i in range(len(rounds[0])):
        times = [rnd[i][key] for rnd in rounds]
        out.append((min((rnd[i] for rnd in rounds), key=lambda x: x[key]), times, max(times) / min(times)))
    return out
