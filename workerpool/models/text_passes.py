"""Which texts share an encoder pass: the one batching rule of every model that takes texts.

A pass runs rows padded to its longest text, so its cost is about ``overhead + rows × longest``
in tokens, ``overhead`` being what a pass costs beyond its tokens (running every operator on
a small matrix is less efficient than on a large one). On a 2-core x86 VM with one thread,
all-MiniLM-L6-v2 on onnxruntime costs about 2.8 ms a pass and 0.31 ms a token (``overhead``
about 9 tokens), the numpy ``bert`` 8.4 ms a pass and 0.5 ms a token (about 17 tokens), and a
padding token costs as much as a real one (``scripts/text_pass_cost.py`` measures them). So a
text only joins a pass when that saves more than the padding costs.

:func:`plan_passes` sorts the texts by length and splits them into runs of neighbours with
the least total cost (dynamic programming over the sorted lengths), where no pass pads more
than :data:`PADDING_SHARE` of its real tokens nor holds more than :data:`PASS_TOKENS` tokens.
Past about 128 tokens a pass costs the same per token, while the memory it needs keeps growing
(attention's with the square of the length): onnxruntime's arena keeps about 5 MiB after a
pass of 256 tokens, 24 MiB after one of 1,024. Passes run in the order of their first text, so
that the request that waited longest is answered first: shortest first would make the longest
text of every batch wait for the whole batch (at 16 requests in flight, a p99 of 155-184 ms
against 158-173 ms in the order they came).
"""

from __future__ import annotations

from collections.abc import Sequence

PADDING_SHARE = 0.125  # padding tokens a pass may add, as a share of its real tokens
PASS_TOKENS = 256  # tokens in one pass at most, unless one text is longer (see the module)
MAX_ROWS = 256  # texts in one pass: bounds the planning work per text


def plan_passes(lengths: Sequence[int], overhead: float, max_tokens: int = PASS_TOKENS,
                max_rows: int | None = None) -> list[list[int]]:
    """The indices of ``lengths`` (each text's tokens) grouped into passes, in the order of
    their first text; each pass pads to its longest, at most :data:`PADDING_SHARE` of its real
    tokens, at most ``max_tokens`` in all (a text longer than that runs alone) and at most
    ``max_rows`` texts (--max-batch)."""
    rows_cap = min(max_rows or MAX_ROWS, MAX_ROWS)
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [max(1, lengths[i]) for i in order]  # a pass pads an empty text to one token
    best = [0.0] * (len(order) + 1)  # best[j]: the least cost of the first j sorted texts
    start = [0] * (len(order) + 1)  # where the last pass of that best plan starts
    for end in range(1, len(order) + 1):
        longest = sizes[end - 1]
        real = 0
        best[end] = float("inf")
        for first in range(end - 1, max(end - rows_cap, 0) - 1, -1):
            real += sizes[first]
            rows = end - first
            padded = rows * longest
            if rows > 1 and (padded - real > PADDING_SHARE * real or padded > max_tokens):
                break  # a longer pass, reaching shorter texts, pads more still
            cost = best[first] + overhead + padded
            if cost < best[end]:
                best[end], start[end] = cost, first
    passes: list[list[int]] = []
    end = len(order)
    while end:
        passes.append(order[start[end]:end])
        end = start[end]
    passes.sort(key=min)
    return passes
