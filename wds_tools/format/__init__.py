"""The on-disk format: the only code that knows the bytes docs/FORMAT.md describes.

In the order a read goes: ``names`` (shard names, patterns, the names an index may hold) ->
``transport`` (bytes by URL scheme) -> ``index`` (index.json, samples.npz; ``packed``, ``meta``)
-> ``mixing`` and ``resolve`` (which shards a spec names, and whether they belong together) ->
``tar`` (the one tar reader; ``sample``, ``npy``: the members). Writing: ``tarwrite``,
``index.write_index``, ``sidecars``. The modules import each other at module level only, without a
circle (tests/test_format_graph.py).
"""
