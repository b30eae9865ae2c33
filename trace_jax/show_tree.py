"""`trace-jax show-tree`: one prompt's rollout tree as text and PNG, with V~, outcomes and expanded anchors.

Nodes are (slot, i): i = 0 the prompt, i = t + 1 the history after turn t (see `rollout/tree.py`). A
continuation shares its parent's nodes up to its branch and owns the later ones; its leaf is its last node.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from trace_jax.rollout.tree import Tree


def children(tree: Tree, root: int) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Edges of the tree under root slot `root`: node -> its child nodes, in slot order."""
    kids: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in range(int(tree.num_turns[root])):
        kids.setdefault((root, i), []).append((root, i + 1))
    for c in np.nonzero((np.asarray(tree.parent) == root) & np.asarray(tree.used))[0]:
        b = int(tree.branch_turn[c])
        kids.setdefault((root, b + 1), []).append((int(c), b + 2))
        for i in range(b + 2, int(tree.num_turns[c])):
            kids.setdefault((int(c), i), []).append((int(c), i + 1))
    return kids


def _label(tree: Tree, node: tuple[int, int], kids: dict) -> str:
    s, i = node
    v = float(tree.success[s, i])
    text = "prompt" if i == 0 else f"turn {i - 1}"
    text += f"  V~={v:.2f}" if v != Tree.NO_READING else "  V~=n/a"
    branches = len(kids.get(node, [])) - (1 if node[1] < int(tree.num_turns[s]) else 0)
    if branches > 0 and i > 0:
        text += f"  expanded x{branches}"
    if i == int(tree.num_turns[s]) and node not in kids:
        text += f"  -> leaf of slot {s}: reward {float(tree.reward[s]):.0f}"
    return text


def tree_text(tree: Tree, prompt: int) -> str:
    """The tree of pool prompt `prompt`: one line per node, indented by depth, branches listed under anchors."""
    roots = [int(r) for r in np.nonzero(np.asarray(tree.is_root) & (np.asarray(tree.prompt) == prompt))[0]]
    if not roots:
        raise ValueError(f"prompt {prompt} got no rollouts in this tree; opened prompts: "
                         f"{sorted(set(np.asarray(tree.prompt)[np.asarray(tree.used)].tolist()))}")
    leaves = np.asarray(tree.used) & (np.asarray(tree.prompt) == prompt)
    rewards = np.asarray(tree.reward)[leaves]
    lines = [f"prompt {prompt} (question {int(tree.question[roots[0]])}): {len(roots)} root rollouts, "
             f"{int(leaves.sum())} leaves, {int((rewards > 0.5).sum())} succeeded"]
    for r in roots:
        kids = children(tree, r)
        stack = [((r, 0), 1)]
        while stack:
            node, depth = stack.pop()
            lines.append("  " * depth + _label(tree, node, kids))
            stack.extend((kid, depth + 1 + (k > 0)) for k, kid in reversed(list(enumerate(kids.get(node, [])))))
    return "\n".join(lines)


def plot_tree(tree: Tree, prompt: int, path: str | Path) -> Path:
    """PNG of prompt `prompt`'s tree: turns left to right, nodes coloured by V~, leaves marked by outcome,
    anchors labelled with their number of continuations."""
    import matplotlib as mpl

    roots = [int(r) for r in np.nonzero(np.asarray(tree.is_root) & (np.asarray(tree.prompt) == prompt))[0]]
    if not roots:
        raise ValueError(f"prompt {prompt} got no rollouts in this tree")
    pos: dict[tuple[int, int], tuple[float, float]] = {}
    edges, row = [], [0.0]
    kids_all: dict = {}

    def place(node, depth) -> float:  # leaves take the next row; a node sits at the mean of its children
        kids = kids_all.get(node, [])
        if not kids:
            pos[node] = (depth, row[0])
            row[0] += 1
            return pos[node][1]
        ys = [place(k, depth + 1) for k in kids]
        edges.extend((node, k) for k in kids)
        pos[node] = (depth, float(np.mean(ys)))
        return pos[node][1]

    for r in roots:
        kids_all.update(children(tree, r))
        place((r, 0), 0)
    fig = Figure(figsize=(8, 1 + 0.35 * row[0]), layout="constrained")
    ax = fig.subplots()
    for a, b in edges:
        ax.plot([pos[a][0], pos[b][0]], [pos[a][1], pos[b][1]], color="grey", lw=1, zorder=1)
    cmap = mpl.colormaps["coolwarm_r"]
    for (s, i), (x, y) in pos.items():
        v = float(tree.success[s, i])
        ax.scatter(x, y, s=120, color=cmap(v) if v >= 0 else "white", edgecolor="black", zorder=2)
        if (s, i) not in kids_all:
            ax.annotate("✓" if tree.reward[s] > 0.5 else "✗", (x + 0.12, y), va="center", fontsize=11,
                        color="green" if tree.reward[s] > 0.5 else "red")
        branches = len(kids_all.get((s, i), [])) - 1
        if branches > 0 and i > 0:
            ax.annotate(f"x{branches}", (x, y + 0.3), ha="center", fontsize=8)
    ax.set(xlabel="node: 0 = prompt, t + 1 = after turn t", yticks=[],
           title=f"prompt {prompt}: ✓/✗ leaf outcome, xK continuations from an anchor")
    fig.colorbar(mpl.cm.ScalarMappable(cmap=cmap, norm=mpl.colors.Normalize(0, 1)), ax=ax, label="V~")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def show_run_tree(run_dir: str | Path, step: int | None = None, prompt: int | None = None,
                  out: str | Path | None = None) -> tuple[str, Path]:
    """(text, PNG path) of the tree a finished run's final policy grows on step `step`'s pool and key (default:
    the last step) with the run's allocator and budgets, on the run's task family; `prompt` defaults to the opened
    prompt with most leaves."""
    import jax

    from trace_jax.config import TrainConfig, load_config
    from trace_jax.envs.registry import check_family
    from trace_jax.rollout.schedule import expand_scheduled
    from trace_jax.train.checkpoint import newest_meta, run_checkpoints_dir
    from trace_jax.train.loop import Budget, step_spec

    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run} holds no run (no config.yaml); pass a `trace-jax train` out_dir")
    cfg = load_config(TrainConfig, run / "config.yaml")
    family = check_family(cfg)
    if not (run / family.policy_dir).exists():
        raise FileNotFoundError(f"{run} holds no finished run (no {run / family.policy_dir}); pass a `trace-jax "
                                "train` out_dir")
    _, meta = newest_meta(run_checkpoints_dir(dataclasses.replace(cfg, out_dir=str(run))))  # its budget (a moved run)
    step = cfg.steps if step is None else step
    if step < 1:
        raise ValueError(f"--step must be >= 1, got {step}")
    task = family.setup(cfg)
    spec = step_spec(cfg, Budget(meta["roots"], meta["continuations"], meta["group_size"]), task.pad_id)
    tree, _, _, _ = expand_scheduled(task.load_policy(run / family.policy_dir), task.env, task.pool(step, None),
                                     jax.random.fold_in(jax.random.key(cfg.seed), step), plan=spec.plan,
                                     sampling=spec.sampling, pad_id=spec.pad_id, host=task.host)
    tree = jax.device_get(tree)
    if prompt is None:
        counts = np.bincount(np.asarray(tree.prompt)[np.asarray(tree.used)], minlength=cfg.pool_size)
        prompt = int(np.argmax(counts))
    path = run / f"tree_step{step}_prompt{prompt}.png" if out is None else Path(out)
    text = f"{cfg.allocator} M={meta['roots']} N={meta['continuations']}, step {step}, final policy\n"
    return text + tree_text(tree, prompt), plot_tree(tree, prompt, path)
