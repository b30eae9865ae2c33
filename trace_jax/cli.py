"""The `trace-jax` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def _export(args: argparse.Namespace) -> int:
    from trace_jax.checkpoints import load_model
    from trace_jax.models.hf_io import save_pretrained

    model = load_model(args.checkpoint, step=args.step)
    out = save_pretrained(model, args.out)
    print(f"exported {args.checkpoint} (step {args.step if args.step is not None else 'latest'}) "
          f"to {out} as an HF Qwen3 checkpoint")
    return 0


def _sft(args: argparse.Namespace) -> int:
    from trace_jax.config import SFTConfig, load_config
    from trace_jax.sft import run_sft

    run_sft(load_config(SFTConfig, args.config, args.overrides))
    return 0


def _train(args: argparse.Namespace) -> int:
    from trace_jax import distributed
    from trace_jax.config import TrainConfig, load_config
    from trace_jax.train.loop import train

    if args.allow_config_change and not args.resume:
        raise ValueError("--allow-config-change only applies with --resume; add --resume to continue the run "
                         "in out_dir")
    if args.smoke and args.resume:
        raise ValueError("--smoke checks a config before its run and never resumes one; drop --resume")
    if not args.smoke and (args.smoke_steps is not None or args.preset is not None):
        raise ValueError("--smoke-steps and --preset only apply with --smoke (a real run loads the policy's weights)")
    cluster = distributed.Cluster(args.coordinator, args.num_processes, args.process_id, auto=args.multi_host)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    distributed.join(cluster)
    with distributed.stdout_from_main():
        if args.smoke:
            from trace_jax.train.smoke import smoke

            return 0 if smoke(cfg, args.smoke_steps or SMOKE_STEPS, args.preset) else 1
        train(cfg, resume=args.resume, allow_config_change=args.allow_config_change)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from trace_jax.compare.config import CompareConfig
    from trace_jax.compare.run import compare
    from trace_jax.config import load_config

    extra = ([f"methods=[{args.methods}]"] if args.methods else []) + list(args.overrides)
    ccfg = load_config(CompareConfig, args.config, (QUICK_COMPARE if args.quick else []) + extra)
    if args.protocol:
        from trace_jax.compare.protocol import write_protocol

        Path(ccfg.out_dir).mkdir(parents=True, exist_ok=True)
        print(f"compare: the protocol is in {write_protocol(ccfg, Path(ccfg.out_dir))}; nothing was run")
        return 0
    compare(ccfg)
    return 0


def _show_tree(args: argparse.Namespace) -> int:
    from trace_jax.show_tree import show_run_tree

    text, path = show_run_tree(args.run, args.step, args.prompt, args.out)
    print(text)
    print(f"show-tree: PNG {path}")
    return 0


def _data_build(args: argparse.Namespace) -> int:
    from trace_jax.config import SFTConfig, load_config
    from trace_jax.data.hopworld_tfds import build_dataset

    cfg = load_config(SFTConfig, args.config, args.overrides)
    path = build_dataset(args.data_dir or cfg.data_dir, cfg.world)
    print(f"HopWorld dataset (world seed {cfg.world.seed}) built at {path}")
    return 0


def _bench_sampler(args: argparse.Namespace) -> int:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:  # before JAX starts its CPU backend (a count set wins)
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.host_devices}".strip()
    from trace_jax.bench.sampler import run_sampler_bench

    run_sampler_bench(args.checkpoint, args.batch, args.prompt_len, args.steps, args.mid_batch, args.skip_mid,
                      args.repeats, args.dtype)
    return 0


def _bench_loader(args: argparse.Namespace) -> int:
    from trace_jax.bench.loader import run_loader_bench
    from trace_jax.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, args.config, args.overrides)
    run_loader_bench(cfg.data_dir, cfg.world, cfg.pool_size, args.processes, args.steps, cfg.seed)
    return 0


def _bench_contrast(args: argparse.Namespace) -> int:
    from trace_jax.bench.contrast import run_contrast_bench
    from trace_jax.config import TrainConfig, load_config

    run_contrast_bench(load_config(TrainConfig, args.config, args.overrides), args.samples, args.group, args.probes,
                       args.tower_steps)
    return 0


def _bench_retriever(args: argparse.Namespace) -> int:
    from trace_jax.bench.retriever import run_retriever_bench

    run_retriever_bench(args.passages, args.topk, args.batch, args.clients, args.seconds)
    return 0


def _bench_host(args: argparse.Namespace) -> int:
    from trace_jax.bench.host import run_host_bench

    run_host_bench(args.checkpoint, args.pool_size, args.roots, args.continuations, args.repeats)
    return 0


def _bench_solver(args: argparse.Namespace) -> int:
    from trace_jax.bench.solver import run_solver_bench

    run_solver_bench(args.pool_sizes, args.roots)
    return 0


def _eval(args: argparse.Namespace) -> int:
    import json

    from trace_jax.config import TrainConfig, load_config
    from trace_jax.envs.registry import check_family

    cfg = load_config(TrainConfig, args.config, args.overrides)
    family = check_family(cfg)
    graded = args.responses or args.calls
    if (args.checkpoint is None) == (graded is None) or (args.responses and args.calls):
        raise ValueError("eval takes a policy (--checkpoint DIR) or responses to grade (--responses FILE.jsonl, "
                         "or for bfcl --calls FILE.jsonl), one of them")
    if (args.calls is not None) != (cfg.env == "bfcl") and graded is not None:
        raise ValueError("--calls grades bfcl call sequences (env=bfcl), --responses another family's responses: "
                         f"env={cfg.env} takes {'--calls' if cfg.env == 'bfcl' else '--responses'}")
    if graded is not None:
        if family.score_responses is None:
            raise ValueError(f"env={cfg.env} cannot grade responses written elsewhere; evaluate a --checkpoint")
        responses = Path(graded)
        ev = family.score_responses(cfg, responses)
        out = Path(args.out or responses.parent / "eval")
    else:
        from trace_jax.checkpoints import policy_step

        task = family.setup(cfg)
        checkpoint = Path(args.checkpoint)
        held = policy_step(checkpoint)
        step = args.step if args.step is not None else held or 0
        held_text = f"training step {held}" if held is not None else "no training step (a checkpoint from elsewhere)"
        same = ", as training evaluated that step" if step == held else ""
        print(f"eval: the policy of {held_text} in {checkpoint}; episodes drawn with step {step}'s evaluation key "
              f"(seed {cfg.seed}{same}; --step draws others)")
        ev = task.evaluate(task.load_policy(checkpoint), step, None)
        out = Path(args.out or checkpoint.parent / "eval")
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(ev.metrics, indent=1))
    for name, text in ev.texts.items():
        (out / name).write_text(text)
        print(text)
    for name, rows in ev.records.items():
        (out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    if ev.reliability is not None:
        (out / "reliability.json").write_text(json.dumps(ev.reliability))
    if not ev.texts:
        print("\n".join(f"{k}: {v:.4f}" for k, v in ev.metrics.items()))
    written = ["eval.json", *ev.texts, *ev.records] + (["reliability.json"] if ev.reliability is not None else [])
    print(f"eval: {', '.join(str(out / name) for name in written)}")
    return 0


def _timed_kit(write, out: str, sft_steps: int) -> tuple[Path, str]:
    """A tiny kit written by write(out, sft_steps=...): (its folder, "N s" it took)."""
    import time

    start = time.perf_counter()
    path = Path(write(out, sft_steps=sft_steps))
    return path, f"{time.perf_counter() - start:.0f} s"


def _data_bfcl_tiny(args: argparse.Namespace) -> int:
    from trace_jax.envs.bfcl.kit import write_tiny_bfcl

    out, took = _timed_kit(write_tiny_bfcl, args.out, args.sft_steps)
    print(f"tiny BFCL kit in {out} ({took}): policy/ (tiny Qwen3 + tokenizer with the tool chat template); its "
          "entries come with bfcl-eval.\n"
          "train on it: trace-jax train --config configs/bfcl_tiny.yaml")
    return 0


def _data_search_qa_tiny(args: argparse.Namespace) -> int:
    from trace_jax.data.search_qa_tiny import write_tiny_search_qa

    out, took = _timed_kit(write_tiny_search_qa, args.out, args.sft_steps)
    print(f"tiny search QA kit in {out} ({took}): corpus.jsonl, qa/ (nq, hotpotqa), policy/ (a tiny Qwen3 fine-tuned "
          f"for {args.sft_steps} steps on the kit's scripted episodes, and its tokenizer).\n"
          f"serve it: trace-jax retrieve serve --corpus {out / 'corpus.jsonl'} --port 8000\n"
          "train on it: trace-jax train --config configs/searchqa_tiny.yaml")
    return 0


def _data_math_tiny(args: argparse.Namespace) -> int:
    from trace_jax.envs.math.kit import write_tiny_math

    out, took = _timed_kit(write_tiny_math, args.out, args.sft_steps)
    print(f"tiny math kit in {out} ({took}): problems/ (train.jsonl, eval/kit.jsonl), policy/ (tiny Qwen3 + "
          "tokenizer).\n"
          "train on it: trace-jax train --config configs/math_tiny.yaml")
    return 0


def _sandbox_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trace_jax.envs.math.sandbox import SandboxConfig, SandboxPool, observation

    cfg = SandboxConfig(workers=1, cpu_s=args.cpu_s, wall_s=args.wall_s, memory_mb=args.memory_mb)
    cells = [Path(f).read_text() for f in args.files]
    with SandboxPool(cfg) as pool:
        result = pool.run(cells)
    print(observation(result, cfg))
    print(f"(status: {result.status})")
    return 0


def _bench_sandbox(args: argparse.Namespace) -> int:
    from trace_jax.bench.sandbox import run_sandbox_bench

    if args.kit:
        from trace_jax.bench.sandbox import run_math_step_bench

        run_math_step_bench(args.kit, args.steps, args.overrides)
    else:
        run_sandbox_bench(args.programs, args.workers, args.repeats)
    return 0


def _config_reference(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trace_jax.config_reference import reference

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(reference())
    print(f"config reference written to {args.out}")
    return 0


def _plan_memory(args: argparse.Namespace) -> int:
    import json
    import math

    from trace_jax.config import TrainConfig, load_config
    from trace_jax.memory import plan_config, render
    from trace_jax.memory.plan import step_shape

    cfg = load_config(TrainConfig, args.config, args.overrides)
    chips = args.chips
    if chips is None:
        sizes = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        if -1 in sizes:
            raise ValueError("--chips is needed: a mesh axis is -1 (fill the chips), e.g. --chips 64")
        chips = math.prod(sizes)
    plan = plan_config(cfg, args.chip, chips, args.preset, args.slots or 0)
    print(json.dumps(plan.as_dict(), indent=1) if args.json else render(plan, step_shape(cfg, args.preset)))
    return 0


def _retrieve_index(args: argparse.Namespace) -> int:
    from trace_jax.retrieval.bm25 import build_index

    path = build_index(args.corpus, args.index)
    print(f"BM25 index of {args.corpus} saved in {path}; serve it with `trace-jax retrieve serve --index {path}`")
    return 0


def _retrieve_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trace_jax.retrieval.bm25 import Bm25Index, build_index
    from trace_jax.retrieval.server import make_server

    if (args.index is None) == (args.corpus is None):
        raise ValueError("give exactly one of --index DIR (built by `trace-jax retrieve index`) or --corpus FILE")
    index = args.index
    if args.corpus is not None:
        index = Path(args.corpus).with_suffix(".bm25")
        try:
            searcher = Bm25Index(index)
        except (FileNotFoundError, ValueError):  # not built yet, or the corpus changed since
            searcher = Bm25Index(build_index(args.corpus, index))
    else:
        searcher = Bm25Index(index)
    server = make_server(searcher, args.host, args.port, args.topk)
    print(f"serving {len(searcher.corpus)} passages of {searcher.corpus.path} at "
          f"http://{args.host}:{server.server_port}/retrieve (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse turns the ValueError into a usage error naming the flag)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


_positive_int.__name__ = "positive integer"  # how argparse names the type in its error


def _positive_ints(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated integers >= 1, e.g. 256,512."""
    return tuple(_positive_int(x) for x in text.split(","))


_positive_ints.__name__ = "comma-separated list of positive integers"


def _data_show(args: argparse.Namespace) -> int:
    import numpy as np

    from trace_jax.envs.hopworld import HopWorldConfig, build_world
    from trace_jax.envs.hopworld.expert import expert_episode, render

    cfg = HopWorldConfig(seed=args.world_seed)
    world = build_world(cfg)
    if not 0 <= args.question < world.num_questions:
        raise ValueError(f"--question must be in [0, {world.num_questions}), got {args.question}")
    if args.checkpoint:
        from trace_jax.checkpoints import load_model
        from trace_jax.evaluate import render_sampled

        print(render_sampled(load_model(args.checkpoint), world, cfg, args.question, args.seed))
        return 0
    episode = expert_episode(world, cfg, args.question, np.random.default_rng(args.seed), args.mistake_prob)
    print(render(episode))
    return 0


SMOKE_STEPS = 3  # `train --smoke` without --smoke-steps

# `compare --quick`: a smoke-sized comparison, applied before the user's overrides
QUICK_COMPARE = ["seeds=2", "methods=[trace,grpo,grpo_matched]", "train.steps=6", "train.eval_every=6",
                 "train.warmup.batches=4", "train.eval_samples=1"]


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="YAML config (default: the built-in defaults, as in configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. steps=100 world.seed=1")


def build_parser() -> argparse.ArgumentParser:
    from trace_jax.envs.registry import FAMILIES

    parser = argparse.ArgumentParser(
        prog="trace-jax",
        description="TRACE: tree-structured rollout budget allocation for multi-turn agentic RL, in JAX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    export = sub.add_parser("export", help="write an orbax policy checkpoint as an HF Qwen3 checkpoint",
                            description="Convert an orbax policy checkpoint into an HF-layout directory "
                                        "(config.json, model.safetensors, success_head.safetensors).")
    export.add_argument("--checkpoint", required=True, help="orbax checkpoint directory")
    export.add_argument("--step", type=int, default=None, help="step to export (default: latest)")
    export.add_argument("--out", required=True, help="output directory for the HF checkpoint")
    export.set_defaults(func=_export)

    sft = sub.add_parser("sft", help="train the HopWorld base policy on expert episodes",
                         description="Supervised warm-up of the HopWorld policy; saves an orbax "
                                     "checkpoint and prints test success per hop count.")
    _add_config_args(sft)
    sft.set_defaults(func=_sft)

    train = sub.add_parser("train", help="RL with TRACE (or a baseline allocator) on a task family (env=...)",
                           description="Train the policy with one allocator on the task family that env names "
                                       f"({', '.join(FAMILIES)}, or module:attribute of your own). With no "
                                       "arguments: "
                                       "the project's main job, a CPU-sized TRACE run on HopWorld that first builds "
                                       "the dataset and the SFT base policy if they are missing.")
    _add_config_args(train)
    train.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in checkpoint_dir (default out_dir/checkpoints). "
                            "Without it a run continues by itself when that directory holds checkpoints of the same "
                            "config (the same command restarted), and refuses to start when they are another run's. "
                            "With it: fails before any work if there is none, or if the config differs from the one "
                            "that checkpoint was saved with. Changes allowed (they alter neither the algorithm nor "
                            "what the metrics measure): steps (to extend the run; not below the checkpoint's step), "
                            "eval_every, checkpoint_every, keep_checkpoints, out_dir, checkpoint_dir and data_dir (a "
                            "moved run, checkpoints or dataset), mesh.*, chunk_slots, refill_slots, remat, pack_rows,"
                            " pack_len and pack_block (device layout, schedule and memory); any other needs --allow-"
                            "config-change")
    train.add_argument("--allow-config-change", action="store_true",
                       help="with --resume: continue even though other config keys changed (they are listed)")
    smoke = train.add_argument_group(
        "smoke check", "Check a slice before the real run: the config's first steps at its real shapes on random "
        "weights, predictor warm-up and evaluations off. Prints each step's time, generated tokens/s and device "
        "memory, saves and restores a checkpoint on the run's storage, then a one-line verdict (exit 1 when it "
        "failed). It writes under out_dir/smoke only (with checkpoint_dir set, its checkpoints go to "
        "<checkpoint_dir>-smoke), so the real run never resumes from its checkpoints. It fails first naming "
        "what is not staged (tokenizer, data, retriever).")
    smoke.add_argument("--smoke", action="store_true", help="run the smoke check instead of training")
    smoke.add_argument("--smoke-steps", type=_positive_int, default=None, metavar="N",
                       help=f"steps of the smoke check (default {SMOKE_STEPS}; the first one compiles)")
    smoke.add_argument("--preset", default=None,
                       help="the policy's dims when its directory has no config.json yet: a public model's, "
                            "qwen3-8b | qwen3-14b (as `trace-jax plan-memory --preset`)")
    hosts = train.add_argument_group(
        "several hosts", "Start the same command on every host; they join through jax.distributed and train as one "
        "run on all their devices (the mesh spans them). Process 0 prints and writes the logs, metrics and plots; "
        "all write the checkpoints. Without these flags the run is one process.")
    hosts.add_argument("--multi-host", action="store_true",
                       help="join the other hosts, found automatically: a Cloud TPU pod slice (every worker), GKE "
                            "TPU, SLURM or Open MPI")
    hosts.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="elsewhere: process 0's address and a free port, the same on every process")
    hosts.add_argument("--num-processes", type=_positive_int, default=None, metavar="N",
                       help="with --coordinator: how many processes join")
    hosts.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="with --coordinator: this process's id, 0 .. N-1 (0 is the coordinator)")
    train.set_defaults(func=_train)

    comp = sub.add_parser("compare", help="train several methods x seeds at equal cost and compare them",
                          description="Train each method (allocator or control) with each seed from the same base "
                                      "policy and predictor warm-up into out_dir/runs/<method>/seed<s> (default "
                                      "out_dir: runs/compare), then write summary.json, results.md (mean ± std over "
                                      "seeds, test success read at equal cumulative generated tokens) and PNGs there. "
                                      "Keys: methods, seeds, out_dir, and train.* (any train key), e.g. seeds=3 "
                                      "train.steps=20.")
    _add_config_args(comp)
    comp.add_argument("--methods", default=None,
                      help="comma-separated methods, e.g. trace,grpo,grpo_matched,trace@32x6 (default: the config's)")
    comp.add_argument("--quick", action="store_true",
                      help="a smoke-sized comparison: " + " ".join(QUICK_COMPARE))
    comp.add_argument("--protocol", action="store_true",
                      help="only write out_dir/PROTOCOL.md (what the runs will do), to read before running them; "
                           "an existing one is kept")
    comp.set_defaults(func=_compare)

    tree = sub.add_parser("show-tree", help="draw one prompt's rollout tree of a finished run (text and PNG)",
                          description="Expand step K's pool with step K's key, the run's allocator and budgets and "
                                      "its final policy; print one prompt's tree (V~ per node, leaf outcomes, "
                                      "continuations per anchor) and save it as a PNG.")
    tree.add_argument("--run", default="runs/hopworld_trace", help="a `trace-jax train` out_dir")
    tree.add_argument("--step", type=_positive_int, default=None, help="step whose pool and key to use (default: last)")
    tree.add_argument("--prompt", type=int, default=None, help="pool index (default: the prompt with most leaves)")
    tree.add_argument("--out", default=None, help="PNG path (default: <run>/tree_step<K>_prompt<i>.png)")
    tree.set_defaults(func=_show_tree)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", metavar="NAME",
                                                                    required=True)
    sampler = bench.add_parser("sampler", help="sampler tokens/s vs transformers; forks vs re-prefill")
    sampler.add_argument("--checkpoint", default="runs/hopworld_sft/checkpoints",
                         help="HopWorld policy checkpoint (random init of the same size if missing)")
    sampler.add_argument("--batch", type=_positive_int, default=64, help="rows for the HopWorld-size model")
    sampler.add_argument("--mid-batch", type=_positive_int, default=64, help="rows for the mid-size model")
    sampler.add_argument("--prompt-len", type=_positive_int, default=32)
    sampler.add_argument("--steps", type=_positive_int, default=32, help="sampled tokens per row")
    sampler.add_argument("--skip-mid", action="store_true", help="skip the ~135M-parameter mid-size model")
    sampler.add_argument("--repeats", type=_positive_int, default=5,
                         help="timed runs per side, the sides taking turns (median and spread printed)")
    sampler.add_argument("--host-devices", type=_positive_int, default=os.cpu_count() or 1,
                         help="CPU devices XLA makes of this host (default: one per core); with more than one, the "
                              "tokens/s table adds our sampler with its rows split over them, as a mesh splits a "
                              "training step's slots (an XLA_FLAGS device count set already is kept)")
    sampler.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                         help="weights and compute of both sides of the tokens/s table (transformers loads the same "
                              "rounded weights)")
    sampler.set_defaults(func=_bench_sampler)
    solver = bench.add_parser("solver", help="compile/run time and memory of the exact allocation solvers")
    solver.add_argument("--pool-sizes", type=_positive_ints, default=(256, 512),
                        help="comma-separated pool sizes B")
    solver.add_argument("--roots", type=_positive_ints, default=(512, 1024), help="comma-separated root budgets M")
    solver.set_defaults(func=_bench_solver)
    loader = bench.add_parser("loader", help="the prompt loader against a grain pipeline on the same data",
                               description="One process's rows of each pool (pool_size B over --processes P), from "
                                           "the config's HopWorld train split: construction time and batches/s of "
                                           "the loader and of grain, back to back, and their ratio.")
    _add_config_args(loader)
    loader.add_argument("--processes", type=_positive_int, default=1, help="processes P sharing each pool")
    loader.add_argument("--steps", type=_positive_int, default=200, help="consecutive batches timed")
    loader.set_defaults(func=_bench_loader)
    contrast = bench.add_parser("contrast", help="a world's contrast (GRPO's effective ratio) and predictor ceilings",
                                description="Sample K episodes of every test question with the base policy: success "
                                            "per hop, the share of mixed groups of G, the root AUC a predictor "
                                            "can reach (the question's own success rate, its hop count's) and the "
                                            "prefix AUC of the turn nodes' world state, beside the warmed-up "
                                            "head's.")
    _add_config_args(contrast)
    contrast.add_argument("--samples", type=_positive_int, default=9, help="episodes per test question (K)")
    contrast.add_argument("--group", type=_positive_int, default=8, help="group size G (< K)")
    contrast.add_argument("--probes", action="store_true",
                          help="also fit probes of the base policy's hidden states for the turn nodes' outcomes, and "
                               "a predictor with a trainable copy of its top layer")
    contrast.add_argument("--tower-steps", type=_positive_int, default=800,
                          help="minibatches (16 episodes each) of that predictor's fit")
    contrast.set_defaults(func=_bench_contrast)
    retr = bench.add_parser("retriever", help="queries/s of the BM25 /retrieve server on a synthetic corpus")
    retr.add_argument("--passages", type=_positive_int, default=100_000)
    retr.add_argument("--topk", type=_positive_int, default=3)
    retr.add_argument("--batch", type=_positive_int, default=32, help="queries per request")
    retr.add_argument("--clients", type=_positive_int, default=4, help="concurrent client threads")
    retr.add_argument("--seconds", type=float, default=10.0, help="time per measurement")
    retr.set_defaults(func=_bench_retriever)
    host = bench.add_parser("host", help="the host path's overhead beyond its tool, against the jitted expansion")
    host.add_argument("--checkpoint", default="runs/hopworld_sft/checkpoints",
                      help="HopWorld policy checkpoint (random init of the same size if missing)")
    host.add_argument("--pool-size", type=_positive_int, default=32)
    host.add_argument("--roots", type=_positive_int, default=16)
    host.add_argument("--continuations", type=int, default=2)
    host.add_argument("--repeats", type=_positive_int, default=5)
    host.set_defaults(func=_bench_host)

    sandbox_bench = bench.add_parser("sandbox", help="programs/s of the math sandbox on the tiny kit's programs")
    sandbox_bench.add_argument("--programs", type=_positive_int, default=400, help="programs per round")
    sandbox_bench.add_argument("--workers", type=int, default=0, help="sandbox workers (0: one per core)")
    sandbox_bench.add_argument("--repeats", type=_positive_int, default=5, help="timed rounds (the median is shown)")
    sandbox_bench.add_argument("--kit", default=None,
                               help="instead, the host's share of TRACE steps on this math kit (data math-tiny)")
    sandbox_bench.add_argument("--steps", type=_positive_int, default=4, help="with --kit: timed steps")
    sandbox_bench.add_argument("overrides", nargs="*", help="with --kit: key=value overrides of configs/math_tiny.yaml")
    sandbox_bench.set_defaults(func=_bench_sandbox)

    sandbox = sub.add_parser("sandbox", help="the math family's code sandbox").add_subparsers(
        dest="sandbox_command", metavar="ACTION", required=True)
    sandbox_run = sandbox.add_parser("run", help="print the observation a program would return to the policy",
                                     description="Runs FILE.py in the sandbox as the math environment does (the "
                                                 "files in order as an episode's cells, the last one's output "
                                                 "shown) and prints the observation the policy would read.")
    sandbox_run.add_argument("files", nargs="+", metavar="FILE.py", help="the cells, earlier ones first")
    sandbox_run.add_argument("--cpu-s", type=_positive_int, default=5, help="CPU seconds")
    sandbox_run.add_argument("--wall-s", type=float, default=10.0, help="wall-clock seconds")
    sandbox_run.add_argument("--memory-mb", type=_positive_int, default=512, help="memory beyond the warm start")
    sandbox_run.set_defaults(func=_sandbox_run)

    ref = sub.add_parser("config-reference", help="write the configuration reference (every key, default, meaning)")
    ref.add_argument("--out", default="docs/config.md")
    ref.set_defaults(func=_config_reference)

    mem = sub.add_parser("plan-memory", help="per-chip memory of a config's training step; the chunk_slots that fits",
                         description="Per chip: params, optimizer, rollout tree, KV cache, rollout and loss-phase "
                                     "bytes and their peak (total), from the shapes the step allocates "
                                     "(trace_jax.memory); chunk_slots is the largest slot capacity (a multiple of "
                                     "data x fsdp) whose step fits the chip's HBM with 10% headroom.")
    _add_config_args(mem)
    mem.add_argument("--chips", type=_positive_int, default=None,
                     help="chips (devices) in the pod (default: mesh.data x mesh.fsdp x mesh.tensor when none is -1)")
    mem.add_argument("--chip", default="v5p", help="chip kind: v4 | v5e | v5p | v6e | cpu (default: v5p)")
    mem.add_argument("--preset", default=None,
                     help="search_qa: plan with a public model's dims (qwen3-8b | qwen3-14b) when policy_dir has no "
                          "config.json yet")
    mem.add_argument("--slots", type=_positive_int, default=None,
                     help="plan with this many slots in flight (default: the config's chunk_slots, else all M*(1+N))")
    mem.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    mem.set_defaults(func=_plan_memory)

    ev = sub.add_parser("eval", help="evaluate a policy on its task family's held-out data",
                        description="The family's evaluation (env) of a policy checkpoint, as training runs it: "
                                    "HopWorld, test success per hop over eval_samples episodes a question and the "
                                    "predictor's quality; search QA, one sampled episode per question of each "
                                    "search_qa.eval_datasets split with EM, F1 and sub-EM per dataset and both "
                                    "averages (needs the retriever running); math, avg@k accuracy per "
                                    "evaluation set, tool calls and unanswered episodes. Writes eval.json and "
                                    "the family's files (e.g. each answer as JSONL).")
    _add_config_args(ev)
    ev.add_argument("--checkpoint", default=None,
                    help="the policy: a run's saved policy (<run>/policy, <run>/hf), or another checkpoint the family "
                         "reads (an HF directory, an orbax one)")
    ev.add_argument("--responses", default=None,
                    help="grade responses produced elsewhere instead of sampling a policy (math: JSONL, one "
                         '{"id": problem id, "response": full text} per line; "set" optional)')
    ev.add_argument("--calls", default=None,
                    help="bfcl: score call sequences produced elsewhere instead of sampling a policy (JSONL, one "
                         '{"id": entry id, "calls": [[[call strings of step 1], [step 2], ...] per user turn]} per '
                         "line, bfcl's decoded multi-turn result)")
    ev.add_argument("--step", type=int, default=None,
                    help="draw the episodes with this step's evaluation key (default: the step the policy was saved "
                         "at, so that a run's final policy scores what training's final evaluation logged)")
    ev.add_argument("--out", default=None, help="output folder (default: <checkpoint or responses>/../eval)")
    ev.set_defaults(func=_eval)

    retrieve = sub.add_parser("retrieve", help="the BM25 retrieval server (Search-R1's /retrieve protocol)"
                              ).add_subparsers(dest="retrieve_command", metavar="ACTION", required=True)
    index = retrieve.add_parser("index", help="build and save a BM25 index of a wiki-18 style JSONL corpus")
    index.add_argument("--corpus", required=True,
                       help='JSONL, one {"id": ..., "contents": "\\"title\\"\\ntext"} per line')
    index.add_argument("--index", required=True, help="output folder")
    index.set_defaults(func=_retrieve_index)
    serve = retrieve.add_parser("serve", help="answer POST /retrieve from a BM25 index",
                                description="Serve Search-R1's /retrieve protocol: POST {\"queries\": [...], "
                                            "\"topk\": k, \"return_scores\": bool}. With --corpus, the index is "
                                            "built next to it (<corpus>.bm25) when missing or stale.")
    serve.add_argument("--index", default=None, help="index folder from `trace-jax retrieve index`")
    serve.add_argument("--corpus", default=None, help="JSONL corpus (indexed on first use)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--topk", type=_positive_int, default=3, help="passages per query when a request gives none")
    serve.set_defaults(func=_retrieve_serve)

    data = sub.add_parser("data", help="dataset commands").add_subparsers(dest="data_command",
                                                                        metavar="ACTION", required=True)
    build = data.add_parser("build", help="build the HopWorld TFDS dataset (array_record)")
    _add_config_args(build)
    build.add_argument("--data-dir", default=None, help="TFDS data dir (default: the config's data_dir)")
    build.set_defaults(func=_data_build)
    tiny = data.add_parser("search-qa-tiny", help="write a tiny offline search QA kit (corpus, QA files, policy)")
    tiny.add_argument("--out", default="artifacts/search_qa_tiny", help="output folder")
    tiny.add_argument("--sft-steps", type=int, default=300,
                      help="fine-tuning steps on scripted episodes (0: a random policy)")
    tiny.set_defaults(func=_data_search_qa_tiny)
    mtiny = data.add_parser("math-tiny", help="write a tiny offline math kit (generated problems, a fitted policy)")
    mtiny.add_argument("--out", default="artifacts/math_tiny", help="output folder")
    mtiny.add_argument("--sft-steps", type=int, default=300,
                       help="fine-tuning steps on scripted episodes (0: a random policy)")
    mtiny.set_defaults(func=_data_math_tiny)
    btiny = data.add_parser("bfcl-tiny", help="write a tiny offline BFCL kit (a policy fitted on a few entries)")
    btiny.add_argument("--out", default="artifacts/bfcl_tiny", help="output folder")
    btiny.add_argument("--sft-steps", type=int, default=200,
                       help="fine-tuning steps on the ground-truth episodes (0: a random policy)")
    btiny.set_defaults(func=_data_bfcl_tiny)
    show = data.add_parser("show", help="render an episode of a HopWorld question (expert, or a policy's)")
    show.add_argument("--question", type=int, default=11)
    show.add_argument("--world-seed", type=int, default=0)
    show.add_argument("--mistake-prob", type=float, default=0.6)
    show.add_argument("--seed", type=int, default=0, help="seed of the expert's mistakes / the policy's sampling")
    show.add_argument("--checkpoint", default=None,
                      help="render one sampled episode of this policy checkpoint instead of the expert")
    show.set_defaults(func=_data_show)
    return parser


def quiet_notices() -> None:
    """Leaves out what every command would print and none needs: transformers' "PyTorch was not found" (the package
    uses its tokenizers and configs alone) and absl's warnings (TFDS's "Variant folder ... has no
    dataset_info.json" before a dataset is built, orbax's notices); errors still print."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_notices()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from trace_jax.envs.math.lockdown import LockdownError
    from trace_jax.retrieval.client import RetrieverError
    from trace_jax.train.preemption import EXIT_CODE, Preempted

    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, KeyError, RetrieverError, LockdownError) as e:
        print(f"trace-jax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Preempted as e:
        print(f"trace-jax {args.command}: {e}", file=sys.stderr)
        return EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
