"""The on-disk format: the only code that knows the bytes docs/FORMAT.md describes.

Reading: ``names`` (shard names, patterns, the names an index may hold) -> ``model`` (index.json typed and
checked) -> ``index`` (index.json and samples.npz; ``meta``, ``packed``) -> ``tar`` (the one tar reader;
``sample``, ``npy``: the members; ``phash``: the stored hash column). Writing: ``tarwrite``,
``index.write_index``, ``sidecars``. No import circle (tests/test_format_graph.py).
"""
