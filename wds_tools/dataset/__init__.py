"""Dataset: which shards a folder, pattern or URL names, whether they are one dataset, and its splits' class gaps."""
