"""training_adapter: turns wds-tools shards into a PyTorch loader (see the loader issue).

Only the index helpers exist so far; ``make_loader`` arrives with the streaming loader.
"""

from wds_tools.index import DatasetIndex, load_index

__all__ = ["DatasetIndex", "load_index"]
