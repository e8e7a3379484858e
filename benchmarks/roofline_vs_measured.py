"""The simulator's roofline beside a measured profile (`benchmarks/gpu/h100_step_profile.py`), point by point.

For each profile (`profile-<shape>.json` of one run), the roofline of the GPU (`--gpu`, default H100) and of
the profile's model preset at its TP degree (`meta.sim_model`; a shape without a preset gets a model of its
own dimensions) predicts every measured point:

    prefill[ISL]    the sum over the prompt's chunks (`meta.chunk_tokens`) of a step with that chunk
    decode[B, C]    a step of B sequences at context C

Two predictions a point: `device`, the roofline's compute-or-memory term alone, which is what the profile
measured (no per-step host work `step_overhead_s`, no all-reduce between TP shards), and `step`, the whole
step as the simulator charges it. error = predicted / measured (> 1: the roofline is slower). The points
that matter (decode batch 8-128, prefill 1k-8k tokens) decide the verdict: the H100 model needs refitting
when its device term is off by more than 15% at any of them.

    .venv/bin/python benchmarks/roofline_vs_measured.py benchmarks/results/gpu/profile-*.json \\
        --out benchmarks/results/gpu/roofline_vs_measured.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from orchestrator.sim.perf_model import GPUS, MODELS, Batch, ModelSpec, RooflineModel  # noqa: E402

TOLERANCE = 0.15
DECODE_BATCHES_THAT_MATTER = (8, 128)
PREFILL_TOKENS_THAT_MATTER = (1024, 8192)


def model_of(meta: dict) -> ModelSpec:
    """The simulator's preset the profile names, or a model of the measured shape's own dimensions."""
    if meta.get("sim_model") in MODELS:
        return MODELS[meta["sim_model"]]
    s = meta["shape"]
    per_layer = (
        s["hidden"] * (s["q_heads"] + 2 * s["kv_heads"]) * s["head_dim"]
        + s["q_heads"] * s["head_dim"] * s["hidden"]
        + 3 * s["hidden"] * s["intermediate"]
    )
    params = s["layers"] * per_layer + 2 * s["vocab"] * s["hidden"]
    return ModelSpec(s["name"], params / 1e9, s["layers"], s["hidden"], s["q_heads"], s["kv_heads"], s["head_dim"])


def rooflines(meta: dict, gpu: str) -> tuple[RooflineModel, RooflineModel]:
    """(the whole step as simulated, its device term alone)."""
    step = RooflineModel(GPUS[gpu], model_of(meta), tp=meta.get("tensor_parallel_size", 1))
    return step, replace(step, step_overhead_s=0.0, allreduce_s_per_layer=0.0)


def chunks(isl: int, chunk: int) -> tuple[tuple[int, int], ...]:
    return tuple((min(chunk, isl - start), start) for start in range(0, isl, chunk))


def compare(profile: dict, gpu: str) -> list[dict]:
    meta = profile["meta"]
    step_model, device_model = rooflines(meta, gpu)
    chunk = meta.get("chunk_tokens") or 1 << 30
    rows = []
    for p in profile["prefill"]:
        batches = [Batch(prefill=(c,)) for c in chunks(p["tokens"], chunk)]
        rows.append(
            _row(
                meta,
                "prefill",
                {"tokens": p["tokens"]},
                p["seconds"],
                batches,
                step_model,
                device_model,
                PREFILL_TOKENS_THAT_MATTER[0] <= p["tokens"] <= PREFILL_TOKENS_THAT_MATTER[1],
            )
        )
    for p in profile["decode"]:
        batch = Batch(decode_contexts=(p["context"],) * p["batch"])
        rows.append(
            _row(
                meta,
                "decode",
                {"batch": p["batch"], "context": p["context"]},
                p["step_seconds"],
                [batch],
                step_model,
                device_model,
                DECODE_BATCHES_THAT_MATTER[0] <= p["batch"] <= DECODE_BATCHES_THAT_MATTER[1],
            )
        )
    return rows


def _row(meta, kind, point, measured, batches, step_model, device_model, matters) -> dict:
    device = sum(device_model.step_time(b) for b in batches)
    step = sum(step_model.step_time(b) for b in batches)
    return {
        "shape": meta["shape"]["name"],
        "kind": kind,
        **point,
        "measured_s": measured,
        "roofline_device_s": device,
        "roofline_step_s": step,
        "error_device": device / measured,
        "error_step": step / measured,
        "matters": matters,
    }


def summary(rows: list[dict]) -> dict:
    """Per shape and kind: the device term's error range and geometric mean; the points that matter off by
    more than the tolerance; the verdict."""
    out: dict = {}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for kind in ("prefill", "decode"):
            mine = [r for r in rows if r["shape"] == shape and r["kind"] == kind]
            if not mine:
                continue
            errors = [r["error_device"] for r in mine]
            off = [r for r in mine if r["matters"] and abs(r["error_device"] - 1) > TOLERANCE]
            out[f"{shape} {kind}"] = {
                "points": len(mine),
                "geomean_error_device": statistics.geometric_mean(errors),
                "min_error_device": min(errors),
                "max_error_device": max(errors),
                "points_that_matter": sum(r["matters"] for r in mine),
                "off_by_more_than_tolerance": len(off),
            }
    off = sum(s["off_by_more_than_tolerance"] for s in out.values())
    matter = sum(s["points_that_matter"] for s in out.values())
    if not matter:
        out["verdict"] = "none: no point that matters was measured"
    elif off:
        out["verdict"] = (
            f"refit: the roofline's device term is off by more than {TOLERANCE:.0%} at {off} of {matter} points "
            "that matter"
        )
    else:
        out["verdict"] = f"within {TOLERANCE:.0%} at all {matter} points that matter"
    return out


def markdown(doc: dict) -> str:
    rows = [
        [
            r["shape"],
            r["kind"],
            str(r["tokens"]) if r["kind"] == "prefill" else f"{r['batch']} × {r['context']}",
            f"{r['measured_s'] * 1000:.2f}",
            f"{r['roofline_device_s'] * 1000:.2f}",
            f"{r['error_device']:.2f}{' *' if r['matters'] else ''}",
            f"{r['roofline_step_s'] * 1000:.2f}",
            f"{r['error_step']:.2f}",
        ]
        for r in doc["rows"]
    ]
    lines = [
        f"- {key}: device-term error {s['min_error_device']:.2f}–{s['max_error_device']:.2f}, geometric mean "
        f"{s['geomean_error_device']:.2f}; {s['off_by_more_than_tolerance']} of {s['points_that_matter']} points "
        "that matter off by more than 15%"
        for key, s in doc["summary"].items()
        if key != "verdict"
    ]
    return (
        f"Roofline ({doc['gpu']}) vs measured ({', '.join(doc['measured_on'])}); error = roofline / measured; "
        "* = a point that matters (decode batch 8-128, prefill 1k-8k).\n\n"
        + report.table(
            [
                "shape",
                "kind",
                "ISL or batch × context",
                "measured ms",
                "roofline device ms",
                "error",
                "roofline step ms",
                "error (step)",
            ],
            rows,
        )
        + "\n"
        + "\n".join(lines)
        + f"\n\nVerdict: {doc['summary']['verdict']}.\n"
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profiles", nargs="+", help="profile-<shape>.json files of one h100_step_profile run")
    p.add_argument("--gpu", default="H100", choices=sorted(GPUS))
    p.add_argument("--out", default=str(launch.RESULTS / "gpu" / "roofline_vs_measured.json"))
    args = p.parse_args(argv)
    profiles = [json.loads(Path(path).read_text()) for path in args.profiles]
    rows = [row for profile in profiles for row in compare(profile, args.gpu)]
    doc = report.document(
        "roofline_vs_measured",
        1,
        gpu=args.gpu,
        measured_on=sorted({str((prof["meta"].get("hardware") or {}).get("gpu")) for prof in profiles}),
        profiles=[str(path) for path in args.profiles],
        tolerance=TOLERANCE,
        rows=rows,
        summary=summary(rows),
    )
    report.write(args.out, doc, markdown)
    return doc


if __name__ == "__main__":
    main()
