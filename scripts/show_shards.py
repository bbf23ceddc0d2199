"""Print what a conversion wrote, and read one sample back with stock webdataset."""

import sys

import webdataset as wds

from wds_tools.format.index import load_index


def main(path: str) -> None:
    idx = load_index(path)
    m = idx.meta
    print(
        f"\n{idx.root}: dataset {m['dataset_version']}, {m['size']}px {m['resize']}, "
        f"{m['samples']} samples in {len(m['shards'])} shards, format v{m['format_version']}"
    )
    print(f"classes: {', '.join(f'{c}={n}' for c, n in zip(m['classes'], m['class_counts']))}")
    print(f"mean {m['mean']}  std {m['std']}  (0-1 units, split {m['stats_split']})")
    for name, sp in m["splits"].items():
        print(f"  {name}: {sp['samples']} samples, {sp['shards']} shard(s) -> {sp['urls']}")
    url = idx.url_pattern(next(iter(m["splits"])))
    key, arr, cls, meta = next(
        iter(wds.WebDataset(url, shardshuffle=False).decode().to_tuple("__key__", "npy", "cls", "json"))
    )
    print(f"stock webdataset reads {url}: first sample {key}: npy {arr.dtype}{list(arr.shape)}, cls {cls}, json {meta}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "shards")
