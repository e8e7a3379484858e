"""Frontend CPU per streamed token over a long answer: is it flat in the answer's length?

A chat stream with a reasoning format (`deepseek_r1`) and "auto" tool calls (`hermes`) on, each
answer `--tokens` tokens long (reasoning, then content, then one tool call at the end), one token a
chunk, through the frontend's own code (`build_frontend`: preparation, the request path, the
streaming choice state, SSE) from a scripted pool (no engine: the frontend's own work is what is
timed). Each event's CPU time is read with `time.thread_time()` around the step of the stream that
makes it. Reported: mean CPU µs per token over the first and the last `--window` tokens, and their
ratio (1.0 = flat; a reader that re-reads the whole output per token grows with the position).
`--rounds` answers; the figures are medians over them, added to benchmarks/results/longest_answer.json
under `--label` with the commit measured. `--tree DIR` measures the frontend code of another checkout
(this script run against it: e.g. a `git worktree` of the commit before the streaming readers), so the
two can be run in turn, interleaved:

    git worktree add /tmp/before 739eaac
    for i in 1 2 3; do
      .venv/bin/python benchmarks/longest_answer.py --label after --rounds 2
      .venv/bin/python benchmarks/longest_answer.py --label before --tree /tmp/before --rounds 2
    done
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--tree" in sys.argv:  # the frontend code under test comes from that checkout
    sys.path.insert(0, os.path.abspath(sys.argv[sys.argv.index("--tree") + 1]))

from benchmarks import launch, report  # noqa: E402
from orchestrator.api.responses import Endpoint  # noqa: E402
from orchestrator.config import PRIMARY_GROUP, AppConfig  # noqa: E402
from orchestrator.frontend import PoolGroup, build_frontend  # noqa: E402
from orchestrator.messages import EngineChunk, EngineRequest, FinishReason, PrefillResult  # noqa: E402
from orchestrator.pools import ReplicaView  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def answer_pieces(tokens: int) -> list[str]:
    """The answer one token a piece: <think>, reasoning words, </think>, content words, a tool call."""
    words = ["cache ", "block ", "route ", "token "]
    reasoning = tokens // 2 - 1
    content = tokens - reasoning - 3
    return (
        ["<think>", *(words[i % 4] for i in range(reasoning)), "</think>"]
        + [words[i % 4] for i in range(content)]
        + [CALL]
    )


class ScriptedPool:
    """One replica that streams `pieces`, one token each, then stops: the far side of the pool boundary."""

    def __init__(self, name: str, pieces: list[str]) -> None:
        self.name = name
        self.pieces = pieces

    def replicas(self) -> list[ReplicaView]:
        return [ReplicaView("r0")]

    async def prefill(self, request: EngineRequest, view: ReplicaView | None = None) -> PrefillResult:
        raise AssertionError("aggregated: no prefill")

    async def generate(self, request: EngineRequest, view: ReplicaView | None = None) -> AsyncIterator[EngineChunk]:
        last = len(self.pieces) - 1
        for i, piece in enumerate(self.pieces):
            yield EngineChunk(
                token_ids=(10 + i % 500,),
                text=piece,
                finish_reason=FinishReason.STOP if i == last else None,
                num_prompt_tokens=8 if i == 0 else 0,
            )


async def one_answer(service, tokens: int) -> list[float]:
    """CPU seconds per SSE event of one streamed answer, in order."""
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "weather?"}],
        "stream": True,
        "max_tokens": tokens + 8,
        "tools": TOOLS,
    }
    stream = await service.handle(Endpoint.CHAT, json.dumps(body).encode())
    costs = []
    while True:
        start = time.thread_time()
        try:
            await anext(stream)
        except StopAsyncIteration:
            break
        costs.append(time.thread_time() - start)
    return costs


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--window", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--label", default="current")
    p.add_argument("--tree", default=None, help="a checkout whose frontend code is measured instead")
    p.add_argument("--out", default=str(launch.RESULTS / "longest_answer.json"))
    args = p.parse_args()
    tokenizer = launch.tiny_model()
    config = AppConfig.model_validate(
        {
            "model": {
                "name": "tiny-llama",
                "source": str(launch.MODEL_DIR),
                "max_model_len": args.tokens + 64,
                "reasoning_parser": "deepseek_r1",
                "tool_call_parser": "hermes",
            },
            "decode_pool": {"engine": {"kind": "sim"}},
            "routing": {"policy": "round_robin"},
        }
    )
    pieces = answer_pieces(args.tokens)
    parts = build_frontend(config, {PRIMARY_GROUP: PoolGroup(ScriptedPool("decode_pool", pieces), None)}, tokenizer)
    rounds = []
    for _ in range(args.rounds):
        costs = asyncio.run(one_answer(parts.service, args.tokens))
        # Events: the role, then one a token; the finish (with the call) and [DONE] last.
        per_token = costs[1 : 1 + args.tokens]
        first = statistics.fmean(per_token[: args.window]) * 1e6
        last = statistics.fmean(per_token[-args.window - 2 : -2]) * 1e6  # before the finish, which parses the call
        rounds.append({"events": len(costs), "first_us": first, "last_us": last, "last_over_first": last / first})
        print(rounds[-1], flush=True)
    out = Path(args.out)
    doc = (
        json.loads(out.read_text())
        if out.exists()
        else report.document(
            "longest_answer",
            1,
            tokens=args.tokens,
            window=args.window,
            formats={"reasoning_parser": "deepseek_r1", "tool_call_parser": "hermes"},
            runs={},
        )
    )
    if (doc["tokens"], doc["window"]) != (args.tokens, args.window):
        sys.exit(f"{out} holds runs of another shape; give another --out")
    run = doc["runs"].setdefault(args.label, {"commit": _commit(args.tree or launch.ROOT), "rounds": []})
    run["rounds"] += rounds
    run["median"] = {
        k: statistics.median(r[k] for r in run["rounds"]) for k in ("first_us", "last_us", "last_over_first")
    }
    report.write(out, doc, markdown, echo=False)
    print(json.dumps({label: r["median"] for label, r in doc["runs"].items()}))


def markdown(doc: dict) -> str:
    """A row per label: its commit, rounds and the medians."""
    rows = [
        [
            label,
            run["commit"][:10],
            str(len(run["rounds"])),
            f"{run['median']['first_us']:.1f}",
            f"{run['median']['last_us']:.1f}",
            f"{run['median']['last_over_first']:.2f}",
        ]
        for label, run in doc["runs"].items()
    ]
    window = doc["window"]
    return report.table(
        [
            "code",
            "commit",
            "answers",
            f"first {window} tokens, CPU µs/token",
            f"last {window} tokens, CPU µs/token",
            "last / first",
        ],
        rows,
    )


def _commit(tree) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
