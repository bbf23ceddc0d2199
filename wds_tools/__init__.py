"""wds-tools: convert image corpora once into versioned WebDataset shards of pre-decoded uint8 arrays.

The converter lives in ``wds_tools.convert`` (``from wds_tools.convert import convert``); it is
not re-exported here so that the module and the function do not shadow each other.
"""

__version__ = "0.1.0"

from .errors import WdsToolsError  # noqa: E402
from .convert.decode import DecodeSettings, decode_image, decode_file  # noqa: E402
from .format.index import DatasetIndex, load_index  # noqa: E402
from .convert.source import read_source  # noqa: E402

__all__ = [
    "__version__",
    "WdsToolsError",
    "DecodeSettings",
    "decode_image",
    "decode_file",
    "DatasetIndex",
    "load_index",
    "read_source",
]
