"""The architecture map (docs/architecture.md, "Layout") names every module and folder of the package, and the
repository's
top-level folders: it cannot drift from the tree unnoticed."""

from layout_map import PACKAGE, ROOT, layout_text, module_entries


def test_the_layout_names_every_module_and_folder():
    layout = layout_text()
    named = module_entries(layout)
    package = ROOT / PACKAGE
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).with_suffix("")
        if "__pycache__" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts and ".".join((PACKAGE, *parts)) not in named:
            missing.append(str(path.relative_to(package)))
    assert not missing, f"the Layout map (docs/architecture.md) does not name: {missing}"
    assert not set(named) - {".".join((PACKAGE, *p.relative_to(package).with_suffix("").parts)).removesuffix(
        ".__init__") for p in package.rglob("*.py")}, (
        "the Layout map (docs/architecture.md) names modules that do not exist")
    for folder in ("configs/", "docs/", "launch/", "colab/", "tests/"):
        assert folder in layout, folder


def test_the_map_parser_reads_entries_sub_folders_and_modules_placed_alone():
    layout = "## Layout\n```\ntrace_jax/\n  a.py   one\n  m/     x.py: the x; y.py and\n         z.py\n" \
             "    s/   u.py\n  m/y.py  y alone, above\n  b.py   uses a.py\ntests/  t.py\n```\n"
    assert module_entries(layout) == {"trace_jax.a": 0, "trace_jax.m": 1, "trace_jax.m.x": 1, "trace_jax.m.z": 1,
                                      "trace_jax.m.s": 2, "trace_jax.m.s.u": 2, "trace_jax.m.y": 3, "trace_jax.b": 4}
